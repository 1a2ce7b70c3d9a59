"""The wide-area network in network namespaces: a topology from a TOML profile (profile.py), built with
ip/tc (netns.py), delay/jitter/loss by our TCP proxy (proxy.py), the ECHO-2 stack on it (stack.py). docs/wan.md."""
