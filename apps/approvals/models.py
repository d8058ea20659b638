"""Approval requests: calls held for a human decision (built out by the approvals issue).

Until then the runner's approval gate refuses calls that need a human, with a
message saying so, rather than running them unapproved.
"""
