"""The browser tests' headless Chromium, shared with the schedule pages' browser tests."""

from apps.schedules.tests.web.test_browser import browser  # noqa: F401 - a fixture, used by name
