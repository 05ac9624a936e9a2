"""Staging space: exports take disjoint token ranges; one that does not fit waits for an import."""

from __future__ import annotations

import asyncio

import pytest

from tropical.serve.workers.staging import StagingSpace


def test_ranges_are_disjoint_and_reused() -> None:
    async def main() -> None:
        space = StagingSpace(10)
        a, b = await space.reserve(4), await space.reserve(5)
        assert (a, b) == (0, 4)
        await space.release(a)
        assert await space.reserve(3) == 0
        assert await space.reserve(1) == 3
        assert await space.reserve(1) == 9
    asyncio.run(main())


def test_an_export_waits_for_room() -> None:
    async def main() -> list[str]:
        space, order = StagingSpace(8), []
        first = await space.reserve(6)

        async def second() -> None:
            await space.reserve(6)
            order.append("second reserved")

        waiting = asyncio.create_task(second())
        await asyncio.sleep(0.01)
        order.append("first released")
        await space.release(first)
        await waiting
        return order
    assert asyncio.run(main()) == ["first released", "second reserved"]


def test_too_big_is_an_error() -> None:
    with pytest.raises(ValueError, match="exceed the staging area"):
        asyncio.run(StagingSpace(4).reserve(5))
