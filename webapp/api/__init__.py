"""The versioned HTTP API (``/api/v1/``): runs from anywhere, per-user API tokens, campaign exports."""
