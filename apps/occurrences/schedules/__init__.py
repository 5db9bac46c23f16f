"""The schedule API (/api/v1/schedules…) and pages (/schedules/…), served by the occurrences
app because every answer shows or changes the schedule's runs: health and next runs on each
schedule, pause/resume/cancel that recall occurrences, run now and backfill. The schedules app
below keeps the schedule's own domain (models, services, selectors, time rules) and imports
nothing from here (docs/architecture.md "Layers and the rule"). Read in this order:

api.py, api_urls.py   the REST endpoints, thin over schedules' services and this app's
                      schedule_changes / manual_runs
serializers.py        the API shapes, validation only (the handler's payload is checked by
                      execution/registry.py)
views.py, urls.py     the tenant web pages
forms.py              the web form, validated by the API's serializer
bulk_api.py           bulk pause/resume/cancel/run now with one receipt (the API)
bulk_views.py         the schedule list's select-many action and its progress page

Templates stay under templates/schedules/; tests in tests/api and tests/web.
"""
