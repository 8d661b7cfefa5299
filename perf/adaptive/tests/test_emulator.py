"""The backend emulator's logic, in one event loop without sockets (pure):
workers, the queue, more workers freeing it, the internal limit, the record."""

from __future__ import annotations

import asyncio

from perf.adaptive.emulator import Backend, Settings


def test_workers_queue_and_a_change_of_capacity():
    async def main() -> tuple[list[int], list[tuple[int, dict]], dict]:
        b = Backend(Settings(workers=2, service_ms=30.0), [{"at": 0.05, "workers": 4}])
        b.start()
        busy = []
        tasks = [asyncio.create_task(b.work()) for _ in range(6)]
        await asyncio.sleep(0.01)
        busy.append(b.busy)
        await asyncio.sleep(0.06)  # after the change at 50 ms
        busy.append(b.busy)
        done = await asyncio.gather(*tasks)
        return busy, done, b.record()

    busy, done, record = asyncio.run(main())
    assert busy[0] == 2, "two workers, the others wait"
    assert busy[1] >= 3, "more workers take waiting requests at once"
    assert [code for code, _ in done] == [200] * 6
    assert record["applied"][0]["workers"] == 4
    w = record["windows"]
    assert sum(x["arrivals"] for x in w) == 6 and sum(x["ok"] for x in w) == 6
    assert w[0]["waiting_max"] == 4


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
