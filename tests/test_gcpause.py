import gc
import subprocess
import sys

import pytest

from toolproxy.runtime.gcpause import gc_paused


@pytest.mark.parametrize("before", [True, False])
def test_pause_restores_what_it_found_even_on_error(before):
    was = gc.isenabled()
    try:
        gc.enable() if before else gc.disable()
        with pytest.raises(RuntimeError), gc_paused():
            assert not gc.isenabled()
            raise RuntimeError("inside")
        assert gc.isenabled() is before
    finally:
        gc.enable() if was else gc.disable()


def test_overlapping_pauses_end_with_the_collector_on():
    assert gc.isenabled()
    outer = gc_paused()
    inner = gc_paused()
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    inner.__exit__(None, None, None)
    assert gc.isenabled()


def _in_fresh_interpreter(code: str) -> str:
    """gc.freeze and thresholds are process-wide: checked where they cannot touch the test run."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_serving_freezes_the_startup_heap_and_collects_the_young_generation_less_often():
    out = _in_fresh_interpreter(
        "import gc; from toolproxy.runtime.gcpause import settle_for_serving, SERVING_YOUNG_THRESHOLD as T\n"
        "import toolproxy.proxy.app\n"
        "settle_for_serving(); young, middle, old = gc.get_threshold()\n"
        "print(gc.get_freeze_count() > 10_000, young == T, (middle, old) == (10, 10), gc.isenabled())"
    )
    assert out == "True True True True"


def test_serving_leaves_a_collector_switched_off_on_purpose_off():
    out = _in_fresh_interpreter(
        "import gc; from toolproxy.runtime.gcpause import settle_for_serving\n"
        "gc.set_threshold(0); settle_for_serving(); print(gc.get_threshold()[0])"
    )
    assert out == "0"
