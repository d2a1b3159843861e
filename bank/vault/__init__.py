"""The vault: the one place the module takes and keeps raw bank account details.

Everywhere else the module refuses anything that looks like an account or routing number
(``payments.kernel.bank_numbers.looks_like_bank_number``); the vault's entry point
(``vault_account_store``, and the API's ``POST /api/vault/accounts/``) takes them, encrypts
them at rest, and answers a token of the module's own that payments carry as their
``source_token``. Only the bank path (``bank.nacha``) reads them back, to write a file.
"""
