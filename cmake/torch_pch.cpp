// The translation unit behind the precompiled <torch/torch.h> that the project's own LibTorch
// targets reuse (pactrain_use_torch_pch in cmake/PactrainProjectOptions.cmake).
