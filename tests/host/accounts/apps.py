from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "tests.host.accounts"
    label = "host_accounts"
