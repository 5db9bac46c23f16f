from django.apps import AppConfig


class TenantsConfig(AppConfig):
    name = "apps.tenants"
    label = "tenants"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        from apps.tenants.middleware import session_logged_in

        # Session bookkeeping at login, like Django's own last_login update (not domain logic;
        # docs/decisions.md: session list).
        user_logged_in.connect(session_logged_in, dispatch_uid="tick-user-session")
        from django.db.models.signals import pre_delete

        from apps.tenants.members import membership_deleted
        from apps.tenants.models import Membership

        # A backstop: the services revoke a leaving member's keys with the actor; a
        # membership deleted any other way (an account deleted in the admin cascades) still
        # takes its keys with it.
        pre_delete.connect(membership_deleted, sender=Membership, dispatch_uid="tick-member-keys")
        from django.db.models.signals import post_migrate

        from apps.tenants import rls

        # Every `migrate` stores the staff claims' key derived from the current SECRET_KEY, so
        # a rotated SECRET_KEY takes effect in the database at the next migrate.
        post_migrate.connect(rls.staff_key_stored, sender=self, dispatch_uid="tick-staff-key")
