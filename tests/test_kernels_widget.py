"""``%resmon kernels`` (issue 44): the live table of every kernel of this
user, in a real kernel watched by nbmon, over real kernels started by
jupyter_client. The test is the page: it reads the record and the widget's
messages as a front end gets them, and presses the buttons by sending the
widget's messages; what happened is read from the kernels themselves (their
replies, their processes)."""
from __future__ import annotations

import os
import queue
import re
import time

import pytest

from helpers import wait_until
from nbmon.views.kernels import REFRESH_S, SEEN_LEASE_S
from test_kernels_overview import Kernel

INTERRUPTIBLE = ("import time\ntry:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n"
                 "    print('interrupted')")


class Page:
    """What a front end of the watching kernel gets: every IOPub message, in order."""

    def __init__(self, kernel: Kernel):
        self.kernel, self.messages = kernel, []

    def drain(self, seconds: float = 0.0) -> list[dict]:
        end = time.monotonic() + seconds
        while True:
            try:
                self.messages.append(self.kernel.kc.get_iopub_msg(timeout=max(0.05, end - time.monotonic())))
            except queue.Empty:
                if time.monotonic() >= end:
                    return self.messages

    def run(self, code: str) -> None:
        """Run a cell, keeping what it and everything else sent."""
        msg_id = self.kernel.kc.execute(code)
        wait_until(lambda: any(m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                               and m["content"]["execution_state"] == "idle" for m in self.drain(0.1)),
                   120, f"the end of {code!r}")
        assert not [m for m in self.messages if m["msg_type"] == "error"], self.messages

    def widget(self, live_id: str) -> dict:
        """The comm_open of the table's widget."""
        return next(m for m in self.drain() if m["msg_type"] == "comm_open"
                    and m["content"]["data"]["state"].get("_nbmon", {}).get("id") == live_id)

    def said(self) -> list[str]:
        return [m["content"]["data"]["content"]["text"] for m in self.drain() if m["msg_type"] == "comm_msg"
                and m["content"]["data"].get("method") == "custom"
                and m["content"]["data"]["content"].get("type") == "nbmon:said"]

    def tables(self, comm_id: str) -> list[dict]:
        """Every table the widget was sent, the first (its open) first."""
        out = []
        for m in self.drain():
            data = m["content"].get("data", {})
            if m["content"].get("comm_id") == comm_id and "table" in data.get("state", {}):
                out.append(data["state"]["table"])
        return out

    def press(self, comm_id: str, **content) -> None:
        kc = self.kernel.kc
        kc.shell_channel.send(kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {
            "method": "custom", "content": {"type": "nbmon:act", **content}}}))


@pytest.fixture
def kernels(tmp_path):
    started = {}
    try:
        for name in ("watch.ipynb", "busy.ipynb", "spare.ipynb"):
            started[name] = Kernel(name, tmp_path)
        yield started
    finally:
        for kernel in started.values():
            kernel.close()


def test_the_live_table_shows_every_kernel_and_its_buttons_interrupt_and_shut_down(kernels):
    watch, busy, spare = kernels["watch.ipynb"], kernels["busy.ipynb"], kernels["spare.ipynb"]
    busy_id = busy.kc.execute(INTERRUPTIBLE)
    watch.run("%load_ext nbmon")
    page = Page(watch)
    page.run("%resmon kernels")
    # The record: every kernel by its notebook, as a table every viewer shows.
    record = next(m["content"] for m in page.drain() if m["msg_type"] == "display_data"
                  and "nbmon-kernels-record" in m["content"]["data"].get("text/html", ""))
    text, page_html = record["data"]["text/plain"], record["data"]["text/html"]
    for kernel in kernels.values():
        assert os.path.basename(kernel.name) in text and os.path.basename(kernel.name) in page_html
        assert str(kernel.pid) in text
    live_id = re.search(r'data-nbmon-kernels="([0-9a-f]+)"', page_html)[1]
    assert record["transient"]["display_id"]   # re-sent by its id
    opened = page.widget(live_id)
    comm_id = opened["content"]["comm_id"]
    rows = {r["pid"]: r for r in opened["content"]["data"]["state"]["table"]["rows"]}
    assert {k.pid for k in kernels.values()} <= set(rows), rows   # and any other kernel of this user
    assert [pid for pid, r in rows.items() if r["this"]] == [watch.pid]
    assert rows[busy.pid]["busy"] is False   # not watched by nbmon: its state unknown, never guessed

    # Read again while the page shows it: a later table comes by itself.
    first = len(page.tables(comm_id))
    wait_until(lambda: len(page.tables(comm_id)) > first, 10, "a refreshed table")

    # Buttons for what is not in the table do nothing: another process, a kernel's pid with another start.
    page.press(comm_id, pid=os.getpid(), started=rows[busy.pid]["started"], action="shutdown")
    page.press(comm_id, pid=spare.pid, started=rows[spare.pid]["started"] + 1, action="shutdown")
    wait_until(lambda: len(page.said()) == 2, 10, "two refusals")
    assert all("not in the table" in line for line in page.said()), page.said()
    assert spare.km.is_alive()

    # Interrupt: the running cell gets KeyboardInterrupt, its kernel lives on.
    page.press(comm_id, pid=busy.pid, started=rows[busy.pid]["started"], action="interrupt")
    reply = busy.kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == busy_id and reply["content"]["status"] == "ok", reply["content"]
    out = ""
    while True:
        msg = busy.kc.get_iopub_msg(timeout=10)
        if msg["parent_header"].get("msg_id") == busy_id and msg["msg_type"] == "stream":
            out += msg["content"]["text"]
        if msg["parent_header"].get("msg_id") == busy_id and msg["msg_type"] == "status" \
                and msg["content"]["execution_state"] == "idle":
            break
    assert out.strip() == "interrupted"
    busy.run("assert 1 + 1 == 2")
    assert page.said()[-1] == f"nbmon: interrupted {busy.name} (pid {busy.pid}).", page.said()

    # Shut down: no Jupyter server runs these kernels, so SIGTERM; the kernel ends and leaves the table.
    page.press(comm_id, pid=spare.pid, started=rows[spare.pid]["started"], action="shutdown")
    wait_until(lambda: not spare.km.is_alive(), 20, "the spare kernel's end")
    assert "SIGTERM" in page.said()[-1], page.said()
    wait_until(lambda: spare.pid not in {r["pid"] for r in page.tables(comm_id)[-1]["rows"]}, 10,
               "a table without the ended kernel")
    assert busy.km.is_alive() and watch.km.is_alive()


def test_the_table_is_read_only_while_a_page_says_it_shows_it(kernels):
    watch = kernels["watch.ipynb"]
    watch.run("%load_ext nbmon")
    page = Page(watch)
    page.run("%resmon kernels")
    live_id = re.search(r'data-nbmon-kernels="([0-9a-f]+)"', next(
        m["content"]["data"]["text/html"] for m in page.drain() if m["msg_type"] == "display_data"))[1]
    comm_id = page.widget(live_id)["content"]["comm_id"]
    # No page says it shows the table: the reads end once the first lease lapses.
    wait_until(lambda: len(page.tables(comm_id)) > 2, 10, "the first reads")
    page.drain(SEEN_LEASE_S + 2 * REFRESH_S)
    quiet = len(page.tables(comm_id))
    page.drain(3 * REFRESH_S)
    assert len(page.tables(comm_id)) == quiet, "read with no page showing it"
    # A page says it shows it: read again.
    watch.kc.shell_channel.send(watch.kc.session.msg("comm_msg", {"comm_id": comm_id, "data": {
        "method": "custom", "content": {"type": "nbmon:seen"}}}))
    wait_until(lambda: len(page.tables(comm_id)) > quiet, 3 * REFRESH_S, "a read once a page shows it")
