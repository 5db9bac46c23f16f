from django.urls import path

from apps.tenants import api

urlpatterns = [
    path("signing-secrets", api.SigningSecretList.as_view(), name="signing-secret-list"),
    path("signing-secrets/rotate", api.SigningSecretRotate.as_view(), name="signing-secret-rotate"),
    path(
        "signing-secrets/<uuid:secret_id>",
        api.SigningSecretDetail.as_view(),
        name="signing-secret-detail",
    ),
]
