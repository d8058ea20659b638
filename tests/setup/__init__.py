"""Tests of issue 12's setup items: the setup page, the dry run, self-explaining forms."""
