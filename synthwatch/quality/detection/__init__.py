"""Detection state of a run, owned by this one package (#35): the evidence, the alarms and their episodes, snoozes
and acknowledgements (counted at claim time), open items and the overrides that weaken detection.

- :mod:`.windows`: rolling windows and whole-run counts rebuilt from the database, the hysteresis of every rate
  alarm (pending and clearing periods, one episode per crossing), the claim gate ``store.queue.claim`` asks
  and the resume gate ``store.queue.apply_control`` asks (which records a resume's acknowledgement; both
  registered on import), the error-share alarm of a broken check and :func:`problem_counts`, the one count of
  alarms, episodes and open items every page reads.
- :mod:`.alarms`: :class:`AlarmKeeper` raises, updates and clears alarm rows (one row is one episode), and the
  acknowledgements (for N claims or M minutes) and pause overrides of a run.
- :mod:`.open_items`: what a fired alarm leaves until it is repaired, excluded or accepted with a reason; its
  :func:`spans` are the bands the run page's charts shade.
- :mod:`.overrides`: which setting changes weaken detection; each needs a reason and is recorded (the guard
  ``store.versions`` asks, registered on import).

Importing this package registers the hooks the store asks (the claim and resume gates, the change guard). Names that two
parts define alike are exported from the part below; ``list_pause_overrides`` is :func:`.alarms.list_overrides`
(the run's auto-pause overrides), ``describe_item`` is :func:`.open_items.describe`.
"""

from __future__ import annotations

from . import alarms, open_items, overrides, windows
from .alarms import (
    ALARM_CAUSES,
    MISMATCH_SYMPTOMS,
    SEVERITIES,
    TRANSPORT_RULES,
    ActiveAlarm,
    AlarmKeeper,
    AlarmNotFound,
    OverrideError,
    acknowledge,
    active_overrides,
    banner_alarms,
    effective_rules,
    fires,
    group_alarms,
    list_alarms,
    rules_for,
    set_auto_pause,
    should_pause,
    snooze_words,
    snoozed_alarms,
    worst_severity,
)
from .alarms import list_overrides as list_pause_overrides
from .open_items import (
    STATES,
    SYNC_EVERY_S,
    SYNC_SHARE,
    TRANSPORT_CHECKS,
    Counted,
    OpenItemError,
    accept,
    accepted_since,
    any_open,
    completion_message,
    count_failing,
    items,
    open_counts,
    open_items_text,
    spans,
    stopped_checks,
    sync,
    sync_run,
    sync_wait_s,
)
from .open_items import describe as describe_item
from .overrides import (
    MAX_REASON_CHARS,
    MIN_REASON_CHARS,
    Weakening,
    guard,
    list_overrides,
    refusal,
    weakenings,
)
from .windows import (
    ERROR_MIN_RECORDS,
    ERROR_SUFFIX,
    ERROR_WINDOW,
    Hysteresis,
    Problems,
    RuleState,
    Window,
    claim_gate,
    error_rule,
    error_share_alarms,
    load_states,
    observe,
    other_workers_live,
    problem_counts,
    recent_windows,
    run_error_share,
    run_problems,
    save_state,
    step,
)

__all__ = [
    'accept', 'accepted_since', 'ack_bound', 'acknowledge', 'active_overrides', 'ActiveAlarm', 'ALARM_CAUSES',
    'AlarmKeeper', 'AlarmNotFound', 'alarms', 'any_open', 'banner_alarms', 'claim_gate', 'completion_message',
    'count_failing', 'Counted', 'describe_item', 'effective_rules', 'ERROR_MIN_RECORDS', 'error_rule',
    'error_share_alarms', 'ERROR_SUFFIX', 'ERROR_WINDOW', 'fires', 'group_alarms', 'guard', 'Hysteresis', 'items',
    'list_alarms', 'list_overrides', 'list_pause_overrides', 'load_states', 'MAX_ACK_MINUTES', 'MAX_ACK_RECORDS',
    'MAX_REASON_CHARS', 'MIN_REASON_CHARS', 'MISMATCH_SYMPTOMS', 'observe', 'open_counts', 'open_items',
    'open_items_text', 'OpenItemError', 'other_workers_live', 'OverrideError', 'overrides', 'problem_counts',
    'Problems', 'recent_windows', 'refusal', 'resume_gate', 'resume_refusal', 'rules_for', 'RuleState',
    'run_error_share', 'run_problems', 'save_state', 'set_auto_pause', 'SEVERITIES', 'should_pause', 'snooze_words',
    'snoozed_alarms', 'spans', 'STATES', 'step', 'stopped_checks', 'sync', 'SYNC_EVERY_S', 'sync_run', 'SYNC_SHARE',
    'sync_wait_s', 'TRANSPORT_CHECKS', 'TRANSPORT_RULES', 'Weakening', 'weakenings', 'Window', 'windows',
    'worst_severity',
]
