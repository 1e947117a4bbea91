"""The full-screen view of `allocscope top`, with curses from the standard library: it reads the
keys (arrows, enter, escape sequences decoded by the terminfo entry), follows resizes and draws
attributes and colours where the terminal has them, with no dependency to install on a box
being debugged.

One thread owns the terminal: it takes the snapshots the recorder queued, updates the model
(reports.live.model), computes a view, draws it (reports.live.text), and handles the keys. The
recording stays in the main thread (signals, ptrace of a launched target); the q key only asks
it to stop (StopRequest.request), and it finalizes the trace as on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import curses
import locale
import os
import queue
import sys
import threading

from common.errors import UsageError
from reports.live.model import LiveModel, LiveView
from reports.live.text import SORTS, ScreenState, screen_lines

KEY_POLL_MS = 100
ENTER_KEYS = (curses.KEY_ENTER, 10, 13)
UP_KEYS = (curses.KEY_UP, ord("k"))
DOWN_KEYS = (curses.KEY_DOWN, ord("j"))
ESCAPE = 27


def unicode_ok() -> bool:
    """The terminal's encoding is UTF-8 (after setlocale from the environment)."""
    return locale.getpreferredencoding(False).lower().replace("-", "") == "utf8"


class Screen:
    """Owns the terminal while `top` runs. `start` puts the screen up (raises UsageError when
    the terminal cannot hold it); `observe` and `progress` are handed to the recording; `finish`
    shows why it ended and, with `wait`, keeps the last frame up until q; then the terminal is
    given back and `last_frame` is what was on screen."""

    def __init__(self, model: LiveModel, stop, state: ScreenState, redraw_each: bool = False) -> None:
        self.model = model
        self.stop = stop
        self.state = state
        self.redraw_each = redraw_each  # launch mode: the command may write over the screen
        self.snaps: queue.Queue = queue.Queue()
        self.view: LiveView | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.last_frame: list = []
        self.quit = False  # q was pressed
        self.ending = False  # the recording has ended
        self.wait = False  # ...and the last frame waits for q
        self.thread = threading.Thread(target=self._main, name="allocscope-screen", daemon=True)
        self.attrs: dict[str, int] = {}

    # --- the recording's side -------------------------------------------------------------

    def start(self) -> None:
        locale.setlocale(locale.LC_ALL, "")
        self.state.unicode = unicode_ok()
        self.thread.start()
        self.ready.wait()
        if self.error is not None:
            self.thread.join()
            term = os.environ.get("TERM", "")
            raise UsageError(
                f"this terminal (TERM={term or 'unset'}) cannot hold the full-screen view ({self.error}); use --batch"
            ) from None

    def observe(self, snap) -> None:  # the recorder's thread
        self.snaps.put(snap)

    def progress(self, msg: str) -> None:
        self.state.message = msg
        self.snaps.put("redraw")

    def finish(self, ended: str, wait: bool) -> None:
        """The recording ended (`ended` says why): show it; with `wait`, until q."""
        self.state.ended = ended + ("  (q: quit)" if wait else "")
        self.wait = wait
        self.snaps.put("end")
        self.thread.join()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Give the terminal back at once (an error in the recording)."""
        if self.thread.is_alive():
            self.wait = False
            self.snaps.put("end")
            self.thread.join()

    # --- the screen's thread --------------------------------------------------------------

    def _main(self) -> None:
        try:
            for var in ("LINES", "COLUMNS"):  # the terminal's own size, not an inherited one
                os.environ.pop(var, None)
            scr = curses.initscr()
        except curses.error as e:
            self.error = e
            self.ready.set()
            return
        try:
            curses.noecho()
            curses.cbreak()
            curses.set_escdelay(25)  # escape alone closes the stack view at once
            scr.keypad(True)
            with contextlib.suppress(curses.error):
                curses.curs_set(0)
            scr.timeout(KEY_POLL_MS)
            self._styles()
            self.ready.set()
            self._loop(scr)
        except Exception as e:  # noqa: BLE001 - a display bug must not leave a recording running blind
            self.error = e
            self.stop.request("display error")
        finally:
            with contextlib.suppress(curses.error):
                scr.keypad(False)
                curses.nocbreak()
                curses.echo()
                curses.endwin()
            self.ready.set()

    def _styles(self) -> None:
        a = {"bold": curses.A_BOLD, "dim": curses.A_DIM, "reverse": curses.A_REVERSE, "": curses.A_NORMAL}
        colours = {
            "red": curses.COLOR_RED,
            "yellow": curses.COLOR_YELLOW,
            "green": curses.COLOR_GREEN,
            "cyan": curses.COLOR_CYAN,
        }
        use = curses.has_colors() and os.environ.get("NO_COLOR") is None
        if use:
            curses.start_color()
            with contextlib.suppress(curses.error):
                curses.use_default_colors()
        for i, (name, c) in enumerate(colours.items(), 1):
            if use:
                try:
                    curses.init_pair(i, c, -1)
                except curses.error:
                    curses.init_pair(i, c, curses.COLOR_BLACK)
                a[name] = curses.color_pair(i)
            else:
                a[name] = curses.A_BOLD if name == "red" else curses.A_NORMAL
        self.attrs = a

    def _loop(self, scr) -> None:
        dirty = True
        while True:
            fresh, dirty = self._take(), dirty
            if fresh is not None:
                dirty = True
                if fresh == "data" and not self.state.frozen or fresh == "end":
                    self.view = self.model.view()
                if self.redraw_each or fresh == "end":
                    scr.clearok(True)
            if self._resized(scr):
                scr.clear()
                dirty = True
            if dirty:
                self._draw(scr)
                dirty = False
            if self.ending and (not self.wait or self.quit or self.stop.reason is not None):
                return
            if self.stop.reason is not None and not self.ending and not self.state.message.startswith("stopping"):
                self.state.message = f"stopping ({self.stop.reason}): finalizing..."
                dirty = True
            key = scr.getch()
            if key != -1:
                dirty = self._key(key) or dirty

    def _take(self) -> str | None:
        """Everything queued: snapshots update the model. 'data' when one came, 'end' when the
        recording ended, 'redraw' for a message, None for nothing."""
        what = None
        while True:
            try:
                item = self.snaps.get_nowait()
            except queue.Empty:
                return what
            if item == "end":
                self.ending = True
                self.state.frozen = False
                self.state.message = ""
                what = "end"
            elif item == "redraw":
                what = what or "redraw"
            else:
                self.model.update(item)
                if self.model.seq == 1:
                    self.state.message = ""  # the set-up's last word ("recording pid ...") is in the header now
                if what != "end":
                    what = "data"

    def _resized(self, scr) -> bool:
        """Follow the terminal's size (read each turn: a resize seen only through SIGWINCH
        would be missed when the signal goes to the recording's thread)."""
        if sys.__stdout__ is None:
            return False
        try:
            cols, lines = os.get_terminal_size(sys.__stdout__.fileno())
        except OSError:
            return False
        if (lines, cols) == scr.getmaxyx():
            return False
        with contextlib.suppress(curses.error):
            curses.resizeterm(lines, cols)
        return True

    def _key(self, key: int) -> bool:
        """Act on a key; True when the screen must be drawn again."""
        st = self.state
        if key in (ord("q"), ord("Q")):
            self.quit = True
            self.stop.request("quit")
        elif key == curses.KEY_RESIZE:
            pass  # curses has taken the new size: draw again
        elif key == ord("s"):
            st.sort = SORTS[(SORTS.index(st.sort) + 1) % len(SORTS)]
            st.selected = 0
        elif key == ord("t"):
            st.threads, st.expanded, st.selected = not st.threads, False, 0
        elif key == ord(" "):
            st.frozen = not st.frozen and not self.ending
            if not st.frozen:
                self.view = self.model.view()
        elif key in ENTER_KEYS:
            st.expanded = not st.expanded and not st.threads
        elif key == ESCAPE:
            st.expanded = False
        elif key in UP_KEYS:
            st.selected = max(0, st.selected - 1)
        elif key in DOWN_KEYS:
            st.selected += 1  # clamped to the rows when drawn
        elif key == curses.KEY_NPAGE:
            st.selected += 10
        elif key == curses.KEY_PPAGE:
            st.selected = max(0, st.selected - 10)
        elif key == curses.KEY_HOME:
            st.selected = 0
        else:
            return False
        return True

    def _draw(self, scr) -> None:
        height, width = scr.getmaxyx()
        lines = screen_lines(self.view, self.state, width, height)
        self.last_frame = lines
        scr.erase()
        for y, line in enumerate(lines):
            x = 0
            for text, style in line:
                if not text:
                    continue
                with contextlib.suppress(curses.error):  # the bottom-right cell cannot be written
                    scr.addstr(y, x, text, self.attrs.get(style, curses.A_NORMAL))
                x += len(text)
        scr.noutrefresh()
        curses.doupdate()
