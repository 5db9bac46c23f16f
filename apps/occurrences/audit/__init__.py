"""Proof that nothing went silently missing (docs/operations.md "Reconciliation").

reconcile.py     expected instants vs stored occurrences, per class of failure
cron_matcher.py  the independent cron oracle reconcile checks against (not timerules)
stuck.py         the reaper's cheap stuck-state scan that feeds the gauges
"""
