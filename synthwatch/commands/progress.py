"""`synthwatch run`'s live progress line (moved from commands/run.py, unchanged)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any


class Progress:
    """The live progress line (stderr, rewritten in place on a terminal; plain lines otherwise) or JSON lines.

    What another terminal changes shows here too: every STATE_EVERY_S the run's state, its pause reason and its
    whole-run check rates are read from the database (a `fix` + `rederive` elsewhere changes them; this
    process's own counters do not know). A paused run's line says why, how to resume it and where to look."""

    STATE_EVERY_S = 2.0

    def __init__(self, name: str, *, json_lines: bool, quiet: bool, engine: Any = None, run_id: int | None = None,
                 resume_hint: str = "", ack_hint: str = "", dashboard: str = "",
                 exit_on_pause: bool = False) -> None:
        self.name = name
        self.json_lines = json_lines
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self._last_json = 0.0
        self.engine = engine
        self.run_id = run_id
        self.resume_hint = resume_hint
        self.ack_hint = ack_hint or resume_hint
        self.dashboard = dashboard
        self.exit_on_pause = exit_on_pause
        self.exited_paused = False
        self._db: dict[str, Any] = {}
        self._db_at = -1e9
        self._said_pause = ""
        self._was_paused = False

    def _read_db(self) -> dict[str, Any]:
        if self.engine is None or time.monotonic() - self._db_at < self.STATE_EVERY_S:
            return self._db
        self._db_at = time.monotonic()
        from sqlalchemy import text

        try:
            with self.engine.connect() as conn:
                er = conn.execute(text("SELECT n_fail, n_total FROM check_stat WHERE run_id = :r AND "
                                       "check_name = 'empty_reasoning'"), {"r": self.run_id}).first()
                alarm = conn.execute(text("SELECT title, message FROM alarm WHERE run_id = :r AND active AND "
                                          "auto_paused ORDER BY id DESC LIMIT 1"), {"r": self.run_id}).first()
                status = conn.execute(text("SELECT status_message FROM run WHERE id = :r"),
                                      {"r": self.run_id}).scalar()
                conn.rollback()
        except Exception:  # noqa: BLE001 - a busy database: the line keeps what it last knew
            return self._db
        self._db = {"empty_reasoning": (int(er[0]), int(er[1])) if er else None,
                    "alarm": f"{alarm[0]}: {alarm[1]}" if alarm else None, "status_message": status}
        return self._db

    def pause_line(self, w: Any, ctl: dict[str, Any]) -> str:
        hint = self.resume_hint
        note = getattr(w, "pause_note", "")
        if note:
            # an alarm holds the run (the claim's gate): a plain resume is refused, so the way on is to fix the cause
            # or to acknowledge it for a number of records
            why = note.split(". Acknowledge and resume")[0].removeprefix("paused by ")
            hint = f"fix the cause, or acknowledge and go on: {self.ack_hint}"
        else:
            why = (self._db.get("alarm") or self._db.get("status_message")
                   or "paused from the dashboard or `synthwatch control`")
        why = " ".join(str(why).split())[:300]
        return f"{self.name} PAUSED ({why}) | resume from another terminal: {hint} | {self.dashboard}"

    def tick(self, w: Any) -> None:
        ctl = w.writer.control if w.writer else {}
        paused = w.state == "paused"
        if paused and not self._was_paused:
            self._db_at = -1e9  # the pause's reason now, not the one read up to STATE_EVERY_S ago
        self._was_paused = paused
        db = self._read_db()
        if paused and self.exit_on_pause and not w.tasks and w.local_stop is None:
            self.exited_paused = True
            w.local_stop = "stop"  # in-flight requests are done: this worker exits, the run stays paused
        if self.quiet and not self.json_lines:
            if paused:
                self._say_pause_once(w, ctl)
            return
        s = w.stats
        rps, tps = s.rates()
        n_ok = ctl.get("n_ok", 0) or 0
        cap = ctl.get("cap")
        # what the run can still reach: its ok records, the pending and those in flight; a cap above that is not the
        # target (`ok 0/10000` for 200 prompts counted to a number the dataset cannot reach, #37)
        reachable = n_ok + (ctl.get("n_pending") or 0) + (ctl.get("n_in_flight") or 0)
        target = min(cap, reachable) if cap is not None else reachable
        finished = s.ok + s.errors + s.timeouts
        eta_s = (target - n_ok) / rps if rps > 0 and target > n_ok else None
        er = db.get("empty_reasoning")
        empty_share = er[0] / er[1] if er and er[1] else (s.empty_reasoning / s.ok if s.ok else 0.0)
        info = {
            "run": self.name, "state": w.state, "ok": n_ok, "cap": cap, "target": target,
            "req_per_s": round(rps, 2), "out_tok_per_s": round(tps, 1), "in_flight": len(w.tasks),
            "concurrency": ctl.get("concurrency"), "errors": s.errors, "timeouts": s.timeouts, "retries": s.retries,
            "timeout_share": round(s.timeouts / finished, 4) if finished else 0.0,
            "empty_reasoning_share": round(empty_share, 4),
            "eta_s": round(eta_s) if eta_s is not None else None,
            "db_error": w.writer.error if w.writer else None,
        }
        if paused:
            info["pause"] = self.pause_line(w, ctl)
        if self.json_lines:
            print(json.dumps(info), flush=True)
            return
        if paused:
            # said whole, once (again when the reason changes): cut to the terminal's width, the way to resume
            # would be lost; on a terminal it replaces the progress line, which resumes below it
            self._say_pause_once(w, ctl)
            return
        else:
            self._said_pause = ""
            eta = _fmt_duration(eta_s) if eta_s is not None else "–"
            line = (
                f"{self.name} [{w.state}] ok {n_ok}/{target} | {rps:.1f} req/s | {tps:,.0f} tok/s | "
                f"in flight {len(w.tasks)}/{ctl.get('concurrency')} | errors {s.errors} | "
                f"timeouts {s.timeouts} ({info['timeout_share']:.1%} of this worker's finished) | empty reasoning "
                f"{empty_share:.1%} (whole run) | ETA {eta}"
            )
        if info["db_error"]:
            line += f" | DATABASE: {info['db_error']}"
        if self.tty:
            import shutil

            # cut to the terminal's width: a wrapped line is not rewritten in place by \r (it would repeat)
            width = shutil.get_terminal_size((200, 24)).columns - 1
            if len(line) > width:
                line = line[: max(10, width - 1)] + "…"
            print("\r\x1b[2K" + line, end="", file=sys.stderr, flush=True)
        elif time.monotonic() - self._last_json >= 10:
            self._last_json = time.monotonic()
            print(line, file=sys.stderr, flush=True)

    def _say_pause_once(self, w: Any, ctl: dict[str, Any]) -> None:
        line = self.pause_line(w, ctl)
        if line != self._said_pause:
            self._said_pause = line
            print(("\r\x1b[2K" if self.tty else "") + line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.tty and not self.quiet and not self.json_lines:
            print(file=sys.stderr)


def _fmt_duration(s: float) -> str:
    s = int(s)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
