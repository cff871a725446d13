"""Cron schedules: the cron parser, schedule specs, catch-up, the scheduler loop and
the schedules file."""

from __future__ import annotations
