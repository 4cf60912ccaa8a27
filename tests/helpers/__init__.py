"""What the tests share: fake hosts (sysfs, NVIDIA proc and driver trees, a kubelet), container and image
builders, install trees, wheel and venv makers.  No tests here."""
