"""Dates as operators compare them with logs: ISO order, seconds, 24-hour clock (UTC).

Django's English default ("Nov. 23, 2026, 2:01 p.m.") drops the seconds, which is
what tells two calls of one run apart.
"""

DATETIME_FORMAT = "Y-m-d H:i:s"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
