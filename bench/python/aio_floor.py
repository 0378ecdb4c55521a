#!/usr/bin/python3
"""asyncio's own floor per awaited completion, the part of an slotrpc.aio
call no binding change can remove: 32 tasks, each awaiting a loop future
that a reader callback resolves in batches (as slotrpc.aio's completion
queue does), with no RPC.  Under callgrind, two counts N differ by the
cost of their difference:

    valgrind --tool=callgrind /usr/bin/python3 bench/python/aio_floor.py 1100   # and 3300
"""
import asyncio
import os
import sys


async def main(n):
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    os.set_blocking(r, False)
    pending = []

    def drain():
        os.read(r, 4096)
        batch = pending[:]
        pending.clear()
        for f in batch:
            f.set_result(None)
    loop.add_reader(r, drain)
    left = [n]

    async def worker():
        while left[0] > 0:
            left[0] -= 1
            f = loop.create_future()
            if not pending:
                os.write(w, b"x")  # one wake-up per batch
            pending.append(f)
            await f
    await asyncio.gather(*(worker() for _ in range(32)))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
