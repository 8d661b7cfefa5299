"""The backend emulator's logic, in one event loop without sockets (pure):
workers, the queue, more workers freeing it, the internal limit, the record."""

from __future__ import annotations

import asyncio

from perf.adaptive.emulator import Backend, Settings


def test_workers_queue_and_a_change_of_capacity():
    async def main() -> tuple[list[int], list[tuple[int, dict]], dict]:
        b = Backend(Settings(workers=2, service_ms=200.0), [])
        b.start()
        tasks = [asyncio.create_task(b.work()) for _ in range(6)]
        await asyncio.sleep(0.02)  # all six arrived (200 ms each: none done yet)
        busy = [b.busy, len(b.waiters)]
        b.control({"workers": 4})  # more workers take waiting requests at once
        busy += [b.busy, len(b.waiters)]
        done = await asyncio.gather(*tasks)
        return busy, done, b.record()

    busy, done, record = asyncio.run(main())
    assert busy == [2, 4, 4, 2]
    assert [code for code, _ in done] == [200] * 6
    assert record["applied"][0]["workers"] == 4
    w = record["windows"]
    assert sum(x["arrivals"] for x in w) == 6 and sum(x["ok"] for x in w) == 6
    assert w[0]["waiting_max"] == 4


def test_the_schedule_applies_its_changes_in_time():
    async def main() -> dict:
        b = Backend(Settings(workers=2, service_ms=10.0), [{"at": 0.05, "workers": 7, "limit": 5}])
        b.start()
        await asyncio.sleep(0.5)
        return b.record()

    applied = asyncio.run(main())["applied"]
    assert len(applied) == 1 and applied[0]["workers"] == 7 and applied[0]["limit"] == 5
    assert 0.05 <= applied[0]["t"] < 0.4, "on time, within a loaded machine's slack"


def test_the_internal_limit_answers_429_with_retry_after():
    async def main() -> list[tuple[int, dict]]:
        b = Backend(Settings(workers=50, service_ms=1.0, limit=10.0), [])
        b.start()
        return [await b.work() for _ in range(5)]

    answers = asyncio.run(main())
    # A burst of a tenth of the limit (1) then nothing for 100 ms.
    assert answers[0][0] == 200
    assert {code for code, _ in answers[1:]} == {429}
    assert answers[1][1] == {"retry-after": "1", "x-emulator": "shed"}


def test_capacity_is_workers_over_service_time_or_the_limit():
    assert Settings(workers=25, service_ms=100).capacity() == 250
    assert Settings(workers=25, service_ms=100, limit=100).capacity() == 100


def test_a_failing_endpoint_answers_at_once_whatever_the_load_and_apart_from_the_work():
    async def main() -> tuple[list[tuple[int, dict]], dict]:
        b = Backend(Settings(workers=0, service_ms=100.0), [])  # no worker: work would wait
        b.start()
        answers = [b.fail("/_fail/503"), b.fail("/_fail/429?retry_after=3600"), b.fail("/_fail/x")]
        return answers, b.record()

    answers, record = asyncio.run(main())
    assert answers == [(503, {"x-emulator": "fail"}),
                       (429, {"x-emulator": "fail", "retry-after": "3600"}),
                       (500, {"x-emulator": "fail"})]
    w = record["windows"]
    assert sum(x["failed"] for x in w) == 3 and sum(x["arrivals"] for x in w) == 0
