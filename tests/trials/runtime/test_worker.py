"""The worker's log prefixing, driven through real pipes in-process."""

from __future__ import annotations

import os
import threading

from trials.worker import _pump


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def test_every_line_of_both_streams_gets_the_prefix() -> None:
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    log_out_r, log_out_w = os.pipe()
    log_err_r, log_err_w = os.pipe()
    pump = threading.Thread(
        target=_pump, args=({out_r: log_out_w, err_r: log_err_w}, b"[rank 3] ")
    )
    pump.start()
    os.write(out_w, b"first\nsecond part")
    os.write(out_w, b" continues\n")
    os.write(err_w, b"an error\n")
    os.write(out_w, b"no newline at the end")
    os.close(out_w)
    os.close(err_w)
    pump.join(timeout=10)
    os.close(log_out_w)
    os.close(log_err_w)
    assert read_all(log_out_r) == (
        b"[rank 3] first\n[rank 3] second part continues\n[rank 3] no newline at the end\n"
    )
    assert read_all(log_err_r) == b"[rank 3] an error\n"
