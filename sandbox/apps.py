from django.apps import AppConfig


class SandboxConfig(AppConfig):
    """The sandbox processor: a development app the demo, the bench and the tests install.

    It is a test double of the processor, not part of the module: a host installs ``payments``,
    ``callbacks`` and ``triage`` and never this app, so nothing of it ships into production.
    Installed, it adds the ``run_sandbox_processor`` command.
    """

    name = "sandbox"
    verbose_name = "Sandbox processor"
