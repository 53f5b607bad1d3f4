"""The end of a GPU test run says how the multi-rank workers ran here (one GPU per rank, or a
shared GPU), so that a shared-GPU run is never read as a multi-GPU result."""


def pytest_terminal_summary(terminalreporter):
    from gpu_requirements import LAUNCHED, SHARED_GPU_MODE

    for worker, mode in sorted(LAUNCHED.items()):
        note = " (functional only: not a multi-GPU result)" if mode == SHARED_GPU_MODE else ""
        terminalreporter.write_line(f"distgemm: {worker} ran as {mode}{note}")
