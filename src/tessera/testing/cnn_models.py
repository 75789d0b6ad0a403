"""Compact ResNet-18 and MobileNetV2 (torchvision's architectures and initialisation) for the
CNN quantization tests and benchmark, so neither needs torchvision.

The PyPI torchvision wheels are CUDA builds (``torchvision/_C.so`` links ``libc10_cuda.so``) and
do not import against the CPU torch of the dev venv, hence these definitions.  Module names and
``state_dict`` keys follow torchvision's (``conv1``/``bn1``/``layer1.0.downsample.0``,
``features.N.conv.M``, ``classifier.1``), so torchvision weights load into them with
``load_state_dict``.  Both are ``torch.fx`` traceable (no data-dependent control flow).

No weights or data sets may be downloaded, so a *trained* network comes from
:class:`TemplateTask` (a synthetic classification task drawn on the fly) and
:func:`train_on_task` (a minute or two of SGD on one CPU thread): its decisions depend on the
input with real margins, unlike a random-init network's, which is what a quantization
agreement figure needs.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["resnet18", "mobilenet_v2", "bn_recalibrate", "TemplateTask", "train_on_task"]


# ---------------------------------------------------------------- ResNet-18

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), num_classes: int = 1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], 2)
        self.layer3 = self._make_layer(256, layers[2], 2)
        self.layer4 = self._make_layer(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():   # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet((2, 2, 2, 2), num_classes)


# ---------------------------------------------------------------- MobileNetV2

def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class ConvBNReLU(nn.Sequential):
    """torchvision's Conv2dNormActivation(..., activation_layer=ReLU6): conv, bn, relu6."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1):
        super().__init__(nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = [ConvBNReLU(inp, hidden, 1)] if expand_ratio != 1 else []
        layers += [ConvBNReLU(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1))

    def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2):
        super().__init__()
        cin = _make_divisible(32 * width_mult)
        self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
        features = [ConvBNReLU(3, cin, stride=2)]
        for t, c, n, s in self.SETTING:
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(ConvBNReLU(cin, self.last_channel, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes))
        for m in self.modules():   # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


def mobilenet_v2(num_classes: int = 1000) -> MobileNetV2:
    return MobileNetV2(num_classes)


@torch.no_grad()
def bn_recalibrate(model: nn.Module, batches) -> nn.Module:
    """Set every BatchNorm's running statistics from ``batches`` (cumulative average, train-mode
    forward, no gradient) and return the model in eval mode.  A randomly initialised network's
    BatchNorms hold mean 0 / var 1, so its activations grow layer by layer; after this they are
    normalised as in a trained network, which makes a random-init model a fairer test of
    quantization (and its logits depend on the input)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    for x in batches:
        model(x)
    return model.eval()


class TemplateTask:
    """A synthetic ``classes``-way image task with learnable, noisy decisions.

    Class ``c``'s template is an N(0, 1) 3 x 8 x 8 image upsampled bilinearly to ``res`` x ``res``
    and scaled to unit std.  A sample of class ``c`` is its template times an amplitude drawn
    from U[0.5, 1.5], rolled circularly by up to ``res // 8`` pixels on each axis (so the
    network must be shift tolerant, as a CNN is), plus N(0, ``noise``^2) pixel noise.  With
    ``noise`` = 6 (per-pixel SNR about -15 dB) ResNet-18 and MobileNetV2 reach ~94 % after 250
    steps, leaving hard samples near the decision boundary -- the inputs on which a quantized
    model can disagree with its float original.  Deterministic in ``seed``.
    """

    def __init__(self, classes: int = 10, res: int = 64, noise: float = 6.0, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        t = nn.functional.interpolate(torch.randn(classes, 3, 8, 8, generator=g), size=(res, res),
                                      mode="bilinear", align_corners=False)
        self.templates = t / t.flatten(1).std(1).view(classes, 1, 1, 1)
        self.classes, self.res, self.noise = classes, res, noise

    def sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` images (n, 3, res, res) fp32 and their labels (n,) int64, drawn from ``gen``."""
        y = torch.randint(0, self.classes, (n,), generator=gen)
        x = (0.5 + torch.rand(n, 1, 1, 1, generator=gen)) * self.templates[y]
        r = self.res // 8
        shifts = torch.randint(-r, r + 1, (n, 2), generator=gen).tolist()
        x = torch.stack([torch.roll(xi, (a, b), (1, 2)) for xi, (a, b) in zip(x, shifts)]) if n else x
        return x + self.noise * torch.randn(x.shape, generator=gen), y


def train_on_task(model: nn.Module, task: TemplateTask, steps: int = 250, batch: int = 32,
                  lr: float = 0.05, seed: int = 0) -> list[float]:
    """Train ``model`` (its classifier sized ``task.classes``) in place: SGD with momentum 0.9,
    weight decay 1e-4 and a one-cycle learning-rate schedule peaking at ``lr``, ``steps``
    batches of fresh samples.  Leaves the model in eval mode; returns the loss of every step."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps)
    losses = []
    model.train()
    for _ in range(steps):
        x, y = task.sample(batch, gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses
