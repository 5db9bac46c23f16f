"""Forms of the team and account pages: they collect input; the services in
apps/tenants/members.py decide."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import password_validation

from apps.tenants.members import address_canonical
from apps.tenants.models import Membership


class AddressField(forms.EmailField):
    """An e-mail address judged as Tick compares it (`address_canonical`): a look-alike of
    an address is that address, before the format is checked."""

    def to_python(self, value: Any) -> str:
        return address_canonical(str(super().to_python(value)))


class InviteForm(forms.Form):
    email = AddressField(max_length=150)
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.VIEWER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Membership.Role.choices)


class NewAccountForm(forms.Form):
    """The accept page's "create your account": username = the invited address."""

    password1 = forms.CharField(label="Password", strip=False, widget=forms.PasswordInput)
    password2 = forms.CharField(label="Password again", strip=False, widget=forms.PasswordInput)

    def __init__(self, *args: Any, email: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.email = email

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        first, second = data.get("password1"), data.get("password2")
        if first and second and first != second:
            self.add_error("password2", "The two passwords differ.")
        elif first:
            try:
                password_validation.validate_password(first)
            except forms.ValidationError as error:
                self.add_error("password1", error)
        return data
