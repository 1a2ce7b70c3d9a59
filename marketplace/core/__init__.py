"""Pure cores of the control plane (no Django, no Redis): the paper's provisioning arithmetic and activation (sections
3.3-3.4, appendix C.2), the hysteresis controller, billing arithmetic, and the address rules for what others will
dial."""
