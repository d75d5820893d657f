"""BiSeNet face parsing (zllrunning/face-parsing.PyTorch, as MuseTalk uses it).

19 CelebAMask-HQ classes on a ResNet18 context path. Module and attribute names
follow the original so that its `79999_iter.pth` state_dict loads strictly. The
backbone starts random: the checkpoint carries the whole network, so nothing is
fetched from the model zoo.

torch is imported only when the network is first built (`build_bisenet`), so that
importing `pipeline` stays light; the classes are defined once, on that call.
"""

from __future__ import annotations

import functools
from typing import Any

N_CLASSES = 19


def build_bisenet(n_classes: int = N_CLASSES) -> Any:
    """A randomly initialised BiSeNet (torch.nn.Module); load a state_dict into it."""
    return _classes()(n_classes)


def run_bisenet(net: Any, x: Any) -> Any:
    """(B, 19, H, W) class scores of normalised (B, 3, H, W) images, run by
    `cpu_speed`'s fastest runtime for BiSeNet (made once per network)."""
    from pipeline.nets.cpu_speed import cached_runner

    return cached_runner(net, "bisenet", lambda: net, (x[:1],))(x)


@functools.cache
def _classes() -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class ConvBNReLU(nn.Module):
        def __init__(
            self, cin: int, cout: int, ks: int = 3, stride: int = 1, padding: int = 1
        ) -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, ks, stride, padding, bias=False)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.relu(self.bn(self.conv(x)))

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if cin != cout or stride != 1:
                self.downsample = nn.Sequential(
                    nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
                )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            r = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            shortcut = x if self.downsample is None else self.downsample(x)
            return F.relu(shortcut + r)

    def _layer(cin: int, cout: int, stride: int) -> nn.Sequential:
        return nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1))

    class Resnet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = _layer(64, 64, 1)
            self.layer2 = _layer(64, 128, 2)
            self.layer3 = _layer(128, 256, 2)
            self.layer4 = _layer(256, 512, 2)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
            feat8 = self.layer2(self.layer1(x))
            feat16 = self.layer3(feat8)
            return feat8, feat16, self.layer4(feat16)

    class AttentionRefinementModule(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.conv = ConvBNReLU(cin, cout)
            self.conv_atten = nn.Conv2d(cout, cout, 1, bias=False)
            self.bn_atten = nn.BatchNorm2d(cout)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            feat = self.conv(x)
            atten = torch.sigmoid(self.bn_atten(self.conv_atten(feat.mean((2, 3), keepdim=True))))
            return feat * atten

    class ContextPath(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.resnet = Resnet18()
            self.arm16 = AttentionRefinementModule(256, 128)
            self.arm32 = AttentionRefinementModule(512, 128)
            self.conv_head32 = ConvBNReLU(128, 128)
            self.conv_head16 = ConvBNReLU(128, 128)
            self.conv_avg = ConvBNReLU(512, 128, ks=1, padding=0)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            feat8, feat16, feat32 = self.resnet(x)
            avg = self.conv_avg(feat32.mean((2, 3), keepdim=True))
            feat32_sum = self.arm32(feat32) + avg  # broadcast == nearest upsampling of a 1x1 map
            feat32_up = self.conv_head32(
                F.interpolate(feat32_sum, feat16.shape[2:], mode="nearest")
            )
            feat16_sum = self.arm16(feat16) + feat32_up
            feat16_up = self.conv_head16(F.interpolate(feat16_sum, feat8.shape[2:], mode="nearest"))
            return feat8, feat16_up

    class FeatureFusionModule(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.convblk = ConvBNReLU(cin, cout, ks=1, padding=0)
            self.conv1 = nn.Conv2d(cout, cout // 4, 1, bias=False)
            self.conv2 = nn.Conv2d(cout // 4, cout, 1, bias=False)

        def forward(self, fsp: torch.Tensor, fcp: torch.Tensor) -> torch.Tensor:
            feat = self.convblk(torch.cat([fsp, fcp], dim=1))
            atten = torch.sigmoid(self.conv2(F.relu(self.conv1(feat.mean((2, 3), keepdim=True)))))
            return feat * atten + feat

    class BiSeNetOutput(nn.Module):
        def __init__(self, cin: int, mid: int, n_classes: int) -> None:
            super().__init__()
            self.conv = ConvBNReLU(cin, mid)
            self.conv_out = nn.Conv2d(mid, n_classes, 1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv_out(self.conv(x))

    class BiSeNet(nn.Module):
        def __init__(self, n_classes: int = N_CLASSES) -> None:
            super().__init__()
            self.cp = ContextPath()
            self.ffm = FeatureFusionModule(256, 256)
            self.conv_out = BiSeNetOutput(256, 256, n_classes)
            # Auxiliary training heads: kept so the checkpoint loads strictly, never run.
            self.conv_out16 = BiSeNetOutput(128, 64, n_classes)
            self.conv_out32 = BiSeNetOutput(128, 64, n_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            """(B, 3, H, W) ImageNet-normalised RGB -> (B, 19, H, W) class logits."""
            feat8, feat_cp8 = self.cp(x)
            out = self.conv_out(self.ffm(feat8, feat_cp8))
            return F.interpolate(out, x.shape[2:], mode="bilinear", align_corners=True)

    return BiSeNet
