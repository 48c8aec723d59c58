"""The real app (``ui.launch``, as ``slotsweep ui`` runs it) in Debian's headless Chromium.

Each page must show its title and its content, and no Streamlit exception box, opened
by its direct URL and by the sidebar's navigation; a screenshot of each lands in the
session's ``screenshots`` folder under pytest's temporary directory (the path is
printed), at 1400x900 and 1024x768 (``SIZES``). One server and one browser
session serve every check, so the test costs one Streamlit start-up. The
database is the real search of ``real_search`` with the synthetic experiments added
beside it (see ``browsed``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from storage import get_engine
from tests._demo_data import DemoSearch, seed_small_search
from tests.conftest import cannot_run_here, free_port
from tests.real_search import RealSearch
from tests.ui.conftest import copy_database

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--window-size=1400,1400",
)
# The two window sizes every page is looked at (and photographed) in.
SIZES = ((1400, 900), (1024, 768))
WIDE, NARROW = SIZES[0][0], SIZES[1][0]
# Every page in the sidebar's order, with the title its h1 shows.
NAVIGATION = ("Experiments", "Experiment", "Trial", "Compare", "Cluster", "Diagnosis")
WAIT_S = 60.0

pytestmark = pytest.mark.slow


def _ensure_chromium() -> None:
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if shutil.which("apt-get") is None:
        cannot_run_here(
            "Debian's chromium is not installed and apt-get is unavailable to install it"
        )
    result = subprocess.run(
        ["sh", str(REPO_ROOT / ".ci" / "install_chromium.sh")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (
        f".ci/install_chromium.sh failed:\n{result.stdout}\n{result.stderr}"
    )


def _wait_healthy(port: int, server: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the UI exited with code {server.returncode} before serving")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"the UI did not answer on 127.0.0.1:{port} within {WAIT_S:.0f} s")


@pytest.fixture
def browsed(real_search: RealSearch, tmp_path: Path) -> DemoSearch:
    """A copy of the real search's database with the SYNTHETIC experiments seeded beside it.

    The real experiment is looked at on every page; the synthetic ``regression-demo``
    and ``regression-cost`` add what the small real search cannot show (a trial
    running with slots held, a multi-objective study). Returns the synthetic ids, and
    the combined database's URL.
    """
    url = copy_database(real_search.url, tmp_path / "browsed.db")
    return seed_small_search(url, tmp_path / "synthetic")


@pytest.fixture
def served(browsed: DemoSearch, cluster_file: Path, tmp_path: Path) -> Iterator[str]:
    """The app started through ``ui.launch`` on 127.0.0.1 and a free port; its base URL."""
    port = free_port()
    env = {**os.environ, "SLOTSWEEP_CLUSTER": str(cluster_file), "PYTHONUNBUFFERED": "1"}
    env.pop("SLOTSWEEP_DB", None)
    log = open(tmp_path / "ui.log", "w+")  # noqa: SIM115 - closed in teardown
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, ui; sys.exit(ui.launch(sys.argv[1], host='127.0.0.1', port=int(sys.argv[2])))",
            browsed.url,
            str(port),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_healthy(port, server)
        yield f"http://127.0.0.1:{port}"
    finally:
        # launch() forwards SIGTERM to Streamlit, so stopping this PID stops the server.
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)
        log.seek(0)
        output = log.read()
        log.close()
        assert "slotsweep ui: sqlite:///" in output, output


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the screenshots go (pytest's temporary directory); printed for a human to look."""
    folder = tmp_path_factory.mktemp("screenshots")
    print(f"\nUI screenshots: {folder}")
    return folder


@pytest.fixture
def browser(tmp_path: Path, screenshots: Path) -> Iterator[Any]:
    _ensure_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tempfile.mkdtemp(dir=tmp_path)}")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_S)
    driver.screenshots = screenshots
    driver.shown_height = 1400
    try:
        yield driver
    finally:
        driver.quit()


def _waiter(driver: Any) -> Any:
    """A wait that retries when Streamlit re-renders an element between find and read."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(
        driver, WAIT_S, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)
    )


def _open(driver: Any, url: str, title: str, ready: Callable[[Any], bool], shot: str) -> None:
    """Open ``url``; wait for the title and the page's content; fail on an exception box."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By

    driver.get(url)
    wait = _waiter(driver)
    try:
        wait.until(
            lambda d: any(h.text.strip() == title for h in d.find_elements(By.CSS_SELECTOR, "h1"))
        )
        wait.until(ready)
    except TimeoutException:
        driver.save_screenshot(str(driver.screenshots / f"{shot}-timeout.png"))
        # The screenshot's folder is gone once pytest prunes old runs: the page's text
        # (and any exception box in it) goes into the failure itself.
        shown = driver.find_element(By.TAG_NAME, "body").text
        pytest.fail(
            f"{url}: the page did not show {title!r} and its content within {WAIT_S:.0f} s; "
            f"it showed:\n{shown[:3000]}"
        )
    errors = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    _screenshot(driver, shot)
    assert not errors, f"{url}: Streamlit exception: {errors[0].text[:2000]}"


def _screenshot(driver: Any, shot: str) -> None:
    """The whole page: Streamlit scrolls inside its main block, so the window grows to fit."""
    height = driver.execute_script(
        "const m = document.querySelector('[data-testid=\"stMain\"]');"
        "return Math.max(m ? m.scrollHeight : 0, document.body.scrollHeight);"
    )
    width = driver.get_window_size()["width"]
    driver.set_window_size(width, min(int(height) + 120, 9000))
    # The page is laid out again at the new size once two frames have been drawn; a
    # Plotly chart has redrawn once its layout matches the width it is given.
    driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "requestAnimationFrame(() => requestAnimationFrame(() => done(true)));"
    )
    _waiter(driver).until(
        lambda d: d.execute_script(
            "return [...document.querySelectorAll('.js-plotly-plot')].every("
            "p => !p._fullLayout || Math.abs(p._fullLayout.width - p.clientWidth) <= 2);"
        )
    )
    driver.save_screenshot(str(driver.screenshots / f"{shot}.png"))
    driver.set_window_size(width, driver.shown_height)


def _truncated_metrics(driver: Any) -> list[str]:
    """Headline labels and values that do not fit their box (drawn with an ellipsis)."""
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll("
            '\'[data-testid="stMetricValue"] div, [data-testid="stMetricLabel"] p\')]'
            ".filter(e => e.scrollWidth > e.clientWidth + 1).map(e => e.textContent);"
        )
    )


def _sidebar(driver: Any) -> tuple[list[str], str]:
    """The sidebar's page links, in order, and its text."""
    from selenium.webdriver.common.by import By

    links = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stSidebarNav"] a')
    sidebar = driver.find_element(By.CSS_SELECTOR, '[data-testid="stSidebar"]')
    return [a.text.strip() for a in links], str(sidebar.text)


def _text(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "body").text)


def _has(css: str, *texts: str) -> Callable[[Any], bool]:
    from selenium.webdriver.common.by import By

    def check(driver: Any) -> bool:
        body = _text(driver)
        return bool(driver.find_elements(By.CSS_SELECTOR, css)) and all(t in body for t in texts)

    return check


def _offscreen_columns(driver: Any) -> list[int]:
    """For each data grid on the page, how many pixels its columns overflow the grid."""
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll('.dvn-scroller')]"
            ".map(s => Math.max(0, s.scrollWidth - s.clientWidth));"
        )
    )


def _slot_grid(driver: Any) -> dict[str, Any]:
    """The Cluster page's first slot map: its drawn height and the texts inside it."""
    return dict(
        driver.execute_script(
            "const c = document.querySelector('[data-testid=\"stVegaLiteChart\"]');"
            "if (!c) return {height: 0, texts: []};"
            "const r = c.getBoundingClientRect();"
            "return {height: r.height, texts: [...c.querySelectorAll('text')]"
            ".map(t => t.textContent)};"
        )
    )


def test_every_page_in_headless_chromium(
    served: str, browser: Any, browsed: DemoSearch, real_search: RealSearch
) -> None:
    """Every page by direct URL and by the sidebar, at both sizes; links, layout, charts."""
    from selenium.webdriver.common.by import By

    real = real_search
    with get_engine(browsed.url).connect() as conn:
        trials = conn.execute(
            sa.text(
                "SELECT id, optuna_trial_number AS number, state, searcher_metric_value AS value"
                " FROM slotsweep_trials WHERE experiment_id = :e ORDER BY number"
            ),
            {"e": real.experiment_id},
        ).all()
        running_number = conn.execute(
            sa.text("SELECT optuna_trial_number FROM slotsweep_trials WHERE id = :i"),
            {"i": browsed.running_trial_id},
        ).scalar_one()
    best = min((t for t in trials if t.state == "COMPLETED"), key=lambda t: t.value)
    ref = f"{real.experiment_id}.{best.number}"
    chart = '[data-testid="stVegaLiteChart"]'

    def in_grid(driver: Any) -> bool:
        # The data grid draws cells on a canvas; its accessible mirror holds the text.
        return all(n in driver.page_source for n in (real.name, "regression-demo"))

    direct = {
        "experiments": (
            "Experiments",
            f"{served}/experiments",
            # The caption under the table is drawn after the grid.
            lambda d: in_grid(d) and "Rows 1–3 of 3." in _text(d),
        ),
        "experiment": (
            "Experiment",
            f"{served}/experiment?experiment={real.experiment_id}",
            _has(chart, "Learning curves", "ASHA rungs at 1", "Best: trial", "Best trials"),
        ),
        "experiment-multi-objective": (
            "Experiment",
            f"{served}/experiment?experiment={browsed.multi_objective_experiment_id}",
            _has(".js-plotly-plot", "regression-cost", "Pareto front"),
        ),
        "trial": (
            "Trial",
            f"{served}/trial?trial={ref}",
            _has(
                chart,
                f"Trial #{best.number} of {real.name}",
                "val_accuracy",
                "Download checkpoint at step",
                "[rank 0] ",
                "[rank 1] ",
                "train_batch",
                "cpu util (%)",  # the system-metric chart's axis, in its unit
            ),
        ),
        "trial-without-metrics": (
            "Trial",
            f"{served}/trial?trial={browsed.experiment_id}.{running_number}",
            _has("h1", "No metrics recorded for this trial yet.", "System metrics not recorded"),
        ),
        "compare-bare": ("Compare", f"{served}/compare", _has("h1", "Pick 2 to 5 trials")),
        "compare-trials": (
            "Compare",
            f"{served}/compare?trials={','.join(f'{real.experiment_id}.{t.number}' for t in trials)}",
            _has(chart, "hyperparameters differ", "Validation curves"),
        ),
        "compare-experiments": (
            "Compare",
            f"{served}/compare?experiments={real.experiment_id},{browsed.experiment_id}",
            _has(
                chart, "Best so far vs trials ended", "Best so far vs slot-seconds used", "Summary"
            ),
        ),
        "cluster": (
            "Cluster",
            f"{served}/cluster",
            lambda d: "Pool default" in _text(d) and bool(d.find_elements(By.CSS_SELECTOR, chart)),
        ),
    }
    for width, height in SIZES:
        browser.set_window_size(width, height)
        browser.shown_height = height
        for shot, (title, url, ready) in direct.items():
            _open(browser, url, title, ready, f"{shot}-{width}x{height}")
            links, sidebar = _sidebar(browser)
            assert links == list(NAVIGATION), (url, links)
            assert "Auto-refresh" in sidebar and "Database:" in sidebar, (url, sidebar)
            assert "Deploy" not in _text(browser), url
            if shot in ("experiment", "trial"):
                assert not _truncated_metrics(browser), (width, shot, _truncated_metrics(browser))
            if shot == "experiments":
                # The headline table: no column starts off-screen, even at 1024 px.
                assert _offscreen_columns(browser) == [0], (width, _offscreen_columns(browser))
            if shot == "cluster":
                # The slot map: every agent's row drawn, the running trial's label in
                # its cells (it was a 40 px strip with no slot in view).
                grid = _slot_grid(browser)
                assert grid["height"] >= 150, grid
                label = f"{browsed.experiment_id}.{running_number}"
                assert grid["texts"].count(label) >= 2, grid
                assert "9 agent(s), 68 slot(s), 2 held, 66 free." in _text(browser)
                assert "No trial is waiting for slots." in _text(browser)

    # "/" opens the Experiments page at its address.
    _open(browser, f"{served}/", "Experiments", in_grid, "root")
    assert browser.current_url.rstrip("/").endswith("/experiments")

    # In-app navigation: the experiment page's link opens the trial page, by number.
    _open(
        browser,
        f"{served}/experiment?experiment={real.experiment_id}",
        "Experiment",
        _has('[data-testid="stPageLink"] a', "Open trial #0"),
        "experiment-link",
    )
    link = next(
        a
        for a in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stPageLink"] a')
        if a.text.endswith("Open trial #0")
    )
    link.click()
    _waiter(browser).until(_has(chart, f"Trial #0 of {real.name}"))
    assert f"trial={real.experiment_id}.0" in browser.current_url
    # An old link by database id lands on the same trial, under its new address.
    _open(browser, f"{served}/trial?trial={best.id}", "Trial", _has(chart, "Trial #"), "old-link")
    _waiter(browser).until(lambda d: f"trial={ref}" in d.current_url)

    # Navigating: each sidebar link opens its page, bare, with no exception box.
    _open(browser, f"{served}/experiments", "Experiments", in_grid, "navigation-start")
    for title in NAVIGATION:
        link = next(
            a
            for a in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stSidebarNav"] a')
            if a.text.strip() == title
        )
        link.click()
        _waiter(browser).until(
            lambda d, t=title: any(h.text.strip() == t for h in d.find_elements(By.TAG_NAME, "h1"))
        )
        assert _sidebar(browser)[0] == list(NAVIGATION)
        assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]'), title
