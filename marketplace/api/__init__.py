"""The REST API and its HTTP plumbing: views, authentication, throttles, parsers and renderers, the OpenAPI schema
hooks, error replies, JSON limits, and the model export stream."""
