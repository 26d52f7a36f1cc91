"""What the offline API (``omni_core.api``) and the HTTP server (``omni_core.serve``) share, below
both: building and checking a request's inputs, decoding and encoding audio, finding a family's
checkpoint, and the store of saved voices."""
