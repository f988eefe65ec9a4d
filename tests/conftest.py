import os

# Qt tests run without a display; the kernels tests run Triton's interpreter on CPU tensors.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
