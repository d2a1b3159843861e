"""The processor demo's account validation settings, apart from ``demo.validation``: the demo's
runner reads them before Django is set up, and that module imports the app's models."""

# Unvalidated WEB debits are held until their account is validated (not refused).
ENVIRONMENT = {"UNVALIDATED_WEB_DEBITS": "hold"}
