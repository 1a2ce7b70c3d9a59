"""The event loop's Redis client: every call bounded by its own deadline (the connections carry no socket timeout),
and scripts run by their SHA, loaded again when the server forgot them."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from dataplane.redis_async import bounded, connect_async, run_script

ECHO = "return {KEYS[1], ARGV[1]}"


def test_a_call_to_a_server_that_never_answers_ends_at_its_deadline() -> None:
    """A server that takes the connection and the command and never replies: the call raises what a socket timeout
    raised (``redis.TimeoutError``, which the callers retry) at the client's deadline, not never."""

    async def run() -> tuple[type, float]:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await reader.read(65536):
                pass
            writer.close()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = connect_async(f"redis://127.0.0.1:{port}/0", max_connections=2, socket_timeout=0.5)
        started = time.monotonic()
        try:
            await run_script(client, ECHO, keys=["k"], args=["v"])
        except Exception as err:  # noqa: BLE001 - what it raises is the assertion
            raised = type(err)
        else:
            raised = type(None)
        took = time.monotonic() - started
        with pytest.raises(redis.TimeoutError):  # a plain command too
            await bounded(client, client.get("k"))
        await client.aclose()
        server.close()
        await server.wait_closed()
        return raised, took

    raised, took = asyncio.run(run())
    assert raised is redis.TimeoutError
    assert 0.4 < took < 3.0


def test_a_script_the_server_forgot_is_loaded_again_and_run(redis_url) -> None:
    async def run() -> list:
        client = connect_async(redis_url, max_connections=2)
        try:
            first = await run_script(client, ECHO, keys=["k1"], args=["a"])
            await client.script_flush()  # a restart without persistence, or SCRIPT FLUSH
            second = await run_script(client, ECHO, keys=["k2"], args=["b"])
            return [first, second]
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [["k1", "a"], ["k2", "b"]]


def test_a_cancelled_call_leaves_no_reply_for_the_next_one(redis_url) -> None:
    """A call cut by its deadline in the middle of its reply (here a BLPOP that outlives it) must not leave that
    reply on the connection for the next call to read as its own: redis-py drops such a connection."""

    async def run() -> list:
        client = connect_async(redis_url, max_connections=1, socket_timeout=0.3)
        try:
            with pytest.raises(redis.TimeoutError):
                await bounded(client, client.blpop(["echo2:test:never"], timeout=1))
            await client.rpush("echo2:test:never", "late")  # what the BLPOP would have taken
            return [await bounded(client, client.echo("mine")), await bounded(client, client.lpop("echo2:test:never"))]
        finally:
            await client.delete("echo2:test:never")
            await client.aclose()

    assert asyncio.run(run()) == ["mine", "late"]


def test_several_calls_of_a_script_in_one_round_trip_each_with_its_result_or_error(redis_url) -> None:
    """``run_scripts``: the calls of one script in one pipeline, each answered in place (a call the script failed
    on gets its error, the others their results), the script loaded again when the server forgot it."""
    from dataplane.redis_async import run_scripts

    picky = "if ARGV[1] == 'bad' then return redis.error_reply('no thanks') end return {KEYS[1], ARGV[1]}"

    async def run() -> tuple[list, list]:
        client = connect_async(redis_url, max_connections=1)
        try:
            await client.script_flush()
            first = await run_scripts(client, picky, [(["k1"], ["a"]), (["k2"], ["bad"]), (["k3"], ["c"])])
            second = await run_scripts(client, picky, [(["k4"], ["d"])])
            return first, second
        finally:
            await client.aclose()

    first, second = asyncio.run(run())
    assert first[0] == ["k1", "a"] and first[2] == ["k3", "c"]
    assert isinstance(first[1], redis.ResponseError) and "no thanks" in str(first[1])
    assert second == [["k4", "d"]]
