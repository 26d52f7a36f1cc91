"""omni's ``xpu`` platform: Intel GPUs through torch's XPU build (``torch.xpu``)."""
