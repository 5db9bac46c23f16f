"""English formats with the one timestamp format (`2026-12-03 23:45:00 UTC`); TIME_ZONE is
UTC, so `T` writes "UTC"."""

DATETIME_FORMAT = "Y-m-d H:i:s T"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
DATE_FORMAT = "Y-m-d"
SHORT_DATE_FORMAT = "Y-m-d"
TIME_FORMAT = "H:i:s"
MONTH_DAY_FORMAT = "F j"
YEAR_MONTH_FORMAT = "F Y"
