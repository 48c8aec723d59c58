#!/bin/sh
# Debian's headless Chromium and its WebDriver, for the UI's real-browser test.
# Idempotent: does nothing when both binaries are already installed.
set -eu

if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "install_chromium.sh: root (or sudo) is needed to apt-get install chromium" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
quiet="$(dirname "$0")/quiet"
# Only the two packages and what they need: no recommended extras (fonts, themes, docs).
sh "$quiet" $SUDO apt-get update -q
sh "$quiet" $SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver
