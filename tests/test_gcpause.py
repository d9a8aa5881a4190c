import gc

import pytest

from toolproxy.gcpause import gc_paused


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
