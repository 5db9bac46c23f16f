"""Web and API plumbing every app may import; it imports no app (docs/decisions.md
"apps/core"). Read in this order:

openapi.py     the one error shape (`ErrorSerializer`), the error tables and `COMMON`/`BODY`,
               the Idempotency-Key header parameter
fields.py      serializer fields every API shares: strict JSON strings and integers, choices
               in any letter case
pagination.py  keyset pages for every tenant list, API and web; unknown query parameters
no_store.py    `Cache-Control: no-store` for answers that show a secret
admin_base.py  the admin classes' base: refused permissions answer 403, never a redirect
config.py      a component's tunables as one frozen dataclass, each field naming its setting

The doors that turn a request into a tenant (API key, membership) are the tenants app's:
apps/tenants/authentication.py and apps/tenants/web.py.
"""
