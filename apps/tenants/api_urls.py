from django.urls import path

from apps.tenants import api, members_api

urlpatterns = [
    path("signing-secrets", api.SigningSecretList.as_view(), name="signing-secret-list"),
    path("signing-secrets/rotate", api.SigningSecretRotate.as_view(), name="signing-secret-rotate"),
    path(
        "signing-secrets/<uuid:secret_id>",
        api.SigningSecretDetail.as_view(),
        name="signing-secret-detail",
    ),
    path("members", members_api.MemberList.as_view(), name="member-list"),
    path("members/<int:member_id>", members_api.MemberDetail.as_view(), name="member-detail"),
    path("invitations", members_api.InvitationListCreate.as_view(), name="invitation-list"),
    path(
        "invitations/<uuid:invitation_id>",
        members_api.InvitationDetail.as_view(),
        name="invitation-detail",
    ),
    path(
        "invitations/<uuid:invitation_id>/resend",
        members_api.InvitationResend.as_view(),
        name="invitation-resend-api",
    ),
    path(
        "invitations/<uuid:invitation_id>/revoke",
        members_api.InvitationRevoke.as_view(),
        name="invitation-revoke-api",
    ),
]
