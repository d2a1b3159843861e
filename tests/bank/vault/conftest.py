import base64

import pytest

KEY_1 = base64.b64encode(bytes(range(32))).decode()
KEY_2 = base64.b64encode(bytes(range(32, 64))).decode()

ACCOUNT = {
    "merchant_id": "m-1",
    "routing_number": "011000015",
    "account_number": "123456789012",
    "account_type": "checking",
    "holder_name": "Jane Q Customer",
    "sec_code": "PPD",
}
RAW_NUMBERS = ("011000015", "123456789012")


@pytest.fixture
def vault_keys(module_settings):
    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    return module_settings
