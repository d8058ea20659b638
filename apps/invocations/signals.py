"""What the runner announces, for other apps to act on without the runner knowing them.

The approvals app subscribes in its AppConfig.ready, so the dependency points one
way: approvals -> runner, never back (tests/test_architecture.py checks it).
"""

from __future__ import annotations

from django.dispatch import Signal

# Sent after the transaction that held a call commits; kwargs: approval (ApprovalRequest).
call_held = Signal()

# Sent by runner.settle_lapsed with a lapsed call's record, locked, before it is settled;
# kwargs: record (InvocationRecord). A receiver that answers True took the call over (the
# approvals app offers a worker's approved call that never reached its tool to the queue
# again: apps.approvals.tasks.reoffer), and the runner leaves it unsettled.
call_lapsed = Signal()
