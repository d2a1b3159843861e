def token_suffix() -> str:
    """Eight random letters for a demo's source token: random hex can be eight digits, which
    the module refuses as a possible bank account number."""
    import secrets

    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
