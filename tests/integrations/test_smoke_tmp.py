import torch
def test_smoke_timm(hub_repo):
    from winattn.integrations.timm import kernelize_swin, Mode
    from timm.models.swin_transformer import SwinTransformer
    torch.manual_seed(0)
    model = SwinTransformer(img_size=32, patch_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4), window_size=4, num_classes=10)
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    ref = model(x)
    import copy
    m2 = copy.deepcopy(model)
    kernelize_swin(m2, mode=Mode.INFERENCE)
    out = m2(x)
    print((out - ref).abs().max())
    assert (out - ref).abs().max() < 1e-5
