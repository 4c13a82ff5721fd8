from blitzscale.control.backoff import LoadBackoff


def test_failed_loads_wait_longer_each_time_then_the_rank_leaves_service() -> None:
    b = LoadBackoff(base_s=1.0, max_s=60.0, max_failures=3)
    assert b.may_load(2, 0.0)
    assert not b.failed(2, 10.0)
    assert not b.may_load(2, 10.5) and b.may_load(2, 11.0)
    assert not b.failed(2, 11.0)
    assert not b.may_load(2, 12.9) and b.may_load(2, 13.0)  # 2 s after the second
    assert b.may_load(1, 11.0)  # other ranks are not affected
    assert b.failed(2, 13.0)  # the third in a row
    assert not b.may_load(2, 10_000.0) and b.out_of_service == {2}
    assert b.num_failed == 3


def test_a_success_resets_the_count_and_the_wait_is_capped() -> None:
    b = LoadBackoff(base_s=1.0, max_s=4.0, max_failures=0)
    for k in range(10):
        assert not b.failed(0, 100.0 * k)
    assert b.may_load(0, 904.0) and not b.may_load(0, 903.9)
    b.succeeded(0)
    assert b.may_load(0, 0.0)
    b.failed(0, 0.0)
    assert b.may_load(0, 1.0)
