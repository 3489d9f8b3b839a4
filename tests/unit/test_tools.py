"""Tools: what the model is told about their arguments, what the Worker accepts, and how
plain-function (``def``) tools run beside the event loop."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from typing import Annotated, Any

import pytest
from pydantic import Field

import dex
from dex.models import _translate as tr
from dex.testing.wait import wait_until_async
from dex.tools import Interrupt, ToolContext


def context(
    tool: str = "t", *, answers: list[str] | None = None, beats: list[str] | None = None
) -> ToolContext:
    """A call's context; each heartbeat appends the name of the thread it ran on to
    ``beats``."""

    async def beat() -> None:
        if beats is not None:
            beats.append(threading.current_thread().name)

    return ToolContext(
        session_id="s",
        call_id="1.c",
        tool=tool,
        idempotency_key="s/1.c",
        attempt=1,
        _heartbeat=beat,
        answers=answers or [],
    )


# --- argument constraints and descriptions ---------------------------------------------


@dex.tool(kind="read")
async def pick(
    n: Annotated[int, Field(ge=1, le=10, description="How many to pick.")],
    city: str,
    mood: Annotated[str, "How the user feels."] = "calm",
    tags: Annotated[list[str], Field(max_length=3)] | None = None,
) -> str:
    """Pick some things.

    More about picking.

    Args:
        n: Overridden: the Field's own description wins.
        city (str): The city, in full,
            with its country.
        tags: At most three tags.

    Returns:
        What was picked.
    """
    return f"{n} in {city}"


def test_annotated_constraints_and_descriptions_reach_the_schema() -> None:
    properties = pick.spec().parameters["properties"]
    assert properties["n"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 10,
        "description": "How many to pick.",
        "title": "N",
    }
    assert properties["mood"]["description"] == "How the user feels."
    assert properties["tags"]["anyOf"][0]["maxItems"] == 3
    assert pick.spec().parameters["required"] == ["n", "city"]


def test_docstring_args_describe_parameters_and_leave_the_description() -> None:
    properties = pick.spec().parameters["properties"]
    assert properties["city"]["description"] == "The city, in full, with its country."
    assert properties["tags"]["description"] == "At most three tags."
    assert pick.spec().description == (
        "Pick some things.\n\nMore about picking.\n\nReturns:\n    What was picked."
    )


def test_validation_enforces_the_constraints_and_names_the_field() -> None:
    with pytest.raises(dex.ToolError, match=r"tool 'pick': n: .*less than or equal to 10"):
        pick.validate({"n": 500, "city": "Oslo"})
    with pytest.raises(dex.ToolError, match=r"n: .*greater than or equal to 1"):
        pick.validate({"n": 0, "city": "Oslo"})
    with pytest.raises(dex.ToolError, match=r"tags: .*at most 3 items"):
        pick.validate({"n": 1, "city": "Oslo", "tags": ["a", "b", "c", "d"]})
    assert pick.validate({"n": 10, "city": "Oslo"}) == {
        "n": 10,
        "city": "Oslo",
        "mood": "calm",
        "tags": None,
    }


def test_rest_param_fields_describe_parameters() -> None:
    @dex.tool
    async def send(to: str, body: str, ctx: ToolContext) -> None:
        """Send a mail.

        :param to: The address.
        :param str body: The text,
            plain.
        :type body: str
        :returns: nothing.
        """

    properties = send.spec().parameters["properties"]
    assert properties["to"]["description"] == "The address."
    assert properties["body"]["description"] == "The text, plain."
    assert "ctx" not in properties
    assert send.spec().description == "Send a mail.\n\n:returns: nothing."


def test_an_args_section_ends_where_its_indentation_does() -> None:
    @dex.tool
    async def move(src: str, dst: str, force: bool = False) -> None:
        """Move a file.

        Arguments:
            src: Where from.

            dst (str): Where to. Paths may be
                relative: to the working directory.
        Note that nothing is copied.

        Raises:
            OSError: when the disk is full.
        """

    properties = move.spec().parameters["properties"]
    assert properties["src"]["description"] == "Where from."
    assert properties["dst"]["description"] == (
        "Where to. Paths may be relative: to the working directory."
    )
    assert "description" not in properties["force"]
    assert move.spec().description == (
        "Move a file.\n\nNote that nothing is copied.\n\n"
        "Raises:\n    OSError: when the disk is full."
    )


def test_an_explicit_description_keeps_the_parameter_docs() -> None:
    @dex.tool(description="Told to the model instead.")
    async def ping(host: str) -> str:
        """Ping.

        Args:
            host: Where to.
        """
        return host

    assert ping.spec().description == "Told to the model instead."
    assert ping.spec().parameters["properties"]["host"]["description"] == "Where to."


def test_a_docstring_without_sections_is_the_description_as_before() -> None:
    @dex.tool
    async def plain(x: int) -> int:
        """One line.

        Another paragraph: with a colon.
        """
        return x

    assert plain.spec().description == "One line.\n\nAnother paragraph: with a colon."
    assert "description" not in plain.spec().parameters["properties"]["x"]


@pytest.mark.parametrize("translate", [tr.anthropic_tools, tr.chat_tools, tr.responses_tools])
def test_provider_translations_carry_the_constrained_schema(translate: Any) -> None:
    (sent,) = translate([pick.spec()])
    schema = sent.get("input_schema") or sent.get("parameters") or sent["function"]["parameters"]
    assert schema["type"] == "object"
    assert schema["properties"]["n"]["maximum"] == 10
    assert schema["properties"]["n"]["description"] == "How many to pick."


# --- def tools run in a thread -----------------------------------------------------------


async def test_a_def_tool_blocks_its_thread_not_the_loop() -> None:
    @dex.tool
    def slow(seconds: float) -> str:
        time.sleep(seconds)
        return threading.current_thread().name

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    try:
        thread = await slow.invoke(context("slow"), slow.validate({"seconds": 0.3}))
    finally:
        ticker.cancel()
    assert thread == "dex-tool-slow"
    assert ticks >= 5  # the loop ran on while the tool slept (30 ticks unloaded)


async def test_a_def_tools_error_reaches_the_worker_as_it_was_raised() -> None:
    @dex.tool
    def refuse(reason: str) -> str:
        raise dex.ToolError(reason)

    with pytest.raises(dex.ToolError, match="no such customer"):
        await refuse.invoke(context(), {"reason": "no such customer"})


async def test_an_async_tool_runs_on_the_loop() -> None:
    @dex.tool
    async def where() -> str:
        return threading.current_thread().name

    assert await where.invoke(context(), {}) == threading.current_thread().name


async def test_a_def_tool_sees_the_callers_context_variables() -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")
    request_id.set("r-42")

    @dex.tool
    def read_it() -> str:
        return request_id.get()

    assert await read_it.invoke(context(), {}) == "r-42"


async def test_a_def_tool_asks_with_ask_sync_and_the_interrupt_crosses_the_thread() -> None:
    @dex.tool
    def order(item: str, ctx: ToolContext) -> str:
        size = ctx.ask_sync(f"Which size of {item}?", choices=["S", "M"])
        return f"{item} in {size}"

    with pytest.raises(Interrupt) as paused:
        await order.invoke(context(), {"item": "hat"})
    assert paused.value.outcome.status == "asked"
    assert paused.value.outcome.question == "Which size of hat?"
    assert await order.invoke(context(answers=["M"]), {"item": "hat"}) == "hat in M"


async def test_a_def_tool_sleeps_durably_with_sleep_sync() -> None:
    @dex.tool
    def remind(ctx: ToolContext) -> str:
        ctx.sleep_sync(60)
        return "time is up"

    with pytest.raises(Interrupt) as paused:
        await remind.invoke(context(), {})
    assert (paused.value.outcome.status, paused.value.outcome.sleep_seconds) == ("sleep", 60)
    ctx = context()
    ctx.sleeps_done = 1
    assert await remind.invoke(ctx, {}) == "time is up"


async def test_a_def_tool_that_calls_the_async_methods_is_told_what_to_call() -> None:
    @dex.tool
    def wrong(ctx: ToolContext) -> str:
        return str(ctx.ask("Sure?"))

    with pytest.raises(TypeError, match=r"tool wrong is a plain function.*ctx\.ask_sync"):
        await wrong.invoke(context("wrong"), {})

    @dex.tool
    def wrong_sleep(ctx: ToolContext) -> None:
        ctx.sleep(1)

    with pytest.raises(TypeError, match=r"ctx\.sleep_sync"):
        await wrong_sleep.invoke(context("wrong_sleep"), {})

    @dex.tool
    def wrong_beat(ctx: ToolContext) -> None:
        ctx.heartbeat()

    with pytest.raises(TypeError, match=r"ctx\.heartbeat_sync"):
        await wrong_beat.invoke(context("wrong_beat"), {})


async def test_a_def_tool_heartbeats_through_the_loop() -> None:
    @dex.tool
    def beating(ctx: ToolContext) -> None:
        ctx.heartbeat_sync()

    beats: list[str] = []
    await beating.invoke(context(beats=beats), {})
    assert beats == [threading.current_thread().name]  # run on the loop, not the tool thread


async def test_an_async_tool_is_told_to_await_heartbeat() -> None:
    @dex.tool
    async def beating(ctx: ToolContext) -> None:
        ctx.heartbeat_sync()

    with pytest.raises(TypeError, match=r"await ctx\.heartbeat\(\)"):
        await beating.invoke(context(), {})


async def test_a_def_wrapper_around_an_async_body_runs_it_on_the_loop() -> None:
    async def body(ctx: ToolContext) -> str:
        return await ctx.ask("Colour?")

    @dex.tool
    def wrapped(ctx: ToolContext) -> Any:  # a plain decorator's wrapper, say
        return body(ctx)

    assert await wrapped.invoke(context(answers=["red"]), {}) == "red"


async def test_def_polls_and_checks_run_in_threads() -> None:
    @dex.tool(kind="task")
    async def job(ctx: ToolContext) -> str:
        return ctx.idempotency_key

    @job.poll
    def job_poll(ctx: ToolContext, handle: str) -> str:
        return f"{handle} polled in {threading.current_thread().name}"

    @job.check
    def job_check(ctx: ToolContext) -> dex.Checked:
        return dex.Checked(happened=True, result=threading.current_thread().name)

    assert await job.call_poll(context("job"), "s/1.c") == "s/1.c polled in dex-tool-job"
    assert await job.call_check(context("job"), {}) == dex.Checked(True, "dex-tool-job")


async def test_a_cancelled_def_tool_runs_to_its_end_and_its_result_is_dropped() -> None:
    errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, error: errors.append(error))
    started = threading.Event()
    release = threading.Event()
    finished: list[str] = []

    @dex.tool
    def stubborn() -> str:
        started.set()
        release.wait(10)
        finished.append("done")
        return "done"

    task = asyncio.create_task(stubborn.invoke(context("stubborn"), {}))
    assert await asyncio.to_thread(started.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()

    async def thread_ended() -> bool:
        return not any(t.name == "dex-tool-stubborn" for t in threading.enumerate())

    await wait_until_async(thread_ended, what="the tool's thread ended")
    await asyncio.sleep(0)  # one loop pass: runs the thread's hand-back, queued before it ended
    assert finished == ["done"]
    assert errors == []
