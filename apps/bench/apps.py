from django.apps import AppConfig


class BenchConfig(AppConfig):
    """The benchmarks: installed only when settings.TICK_BENCH is on (tickweb/settings.py)."""

    name = "apps.bench"
    label = "bench"
