"""DCGAN (Radford, Metz, Chintala, "Unsupervised Representation Learning with Deep Convolutional
Generative Adversarial Networks", ICLR 2016) for 32x32 CIFAR-10 images: a generator of transposed
convolutions with batch norm and ReLU (tanh output) from a 100-d noise vector, a discriminator of strided
convolutions with batch norm and LeakyReLU(0.2), Adam(2e-4, beta1 0.5) for each. One measured step is
one discriminator update (real and fake batch) and one generator update.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from mtbench.data.base import IMAGES, BatchRecipe
from mtbench.workload.base import SetupContext, StepLoss, Workload, optimizer_from


def _init(m: nn.Module) -> None:
    # the paper: weights from N(0, 0.02); batch-norm scales from N(1, 0.02)
    if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
        nn.init.normal_(m.weight, 0.0, 0.02)
    elif isinstance(m, nn.BatchNorm2d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


class Generator(nn.Sequential):
    def __init__(self, nz: int = 100, ngf: int = 64, channels: int = 3) -> None:
        super().__init__(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),  # 4x4
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),  # 8
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),  # 16
            nn.ConvTranspose2d(ngf, channels, 4, 2, 1, bias=False), nn.Tanh(),  # 32x32
        )
        self.apply(_init)


class Discriminator(nn.Sequential):
    def __init__(self, ndf: int = 64, channels: int = 3) -> None:
        super().__init__(
            nn.Conv2d(channels, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True),  # 16
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, True),  # 8
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 4), nn.LeakyReLU(0.2, True),  # 4
            nn.Conv2d(ndf * 4, 1, 4, 1, 0, bias=False), nn.Flatten(),  # one logit
        )
        self.apply(_init)


class DCGAN(Workload):
    def __init__(self, optimizer_g: Any, optimizer_d: Any, nz: int = 100, ngf: int = 64, ndf: int = 64) -> None:
        self.nz = int(nz)
        self.g, self.d = Generator(nz, ngf), Discriminator(ndf)
        self.make_opt_g, self.make_opt_d = optimizer_g, optimizer_d

    def setup(self, ctx: SetupContext) -> None:
        self.g.to(ctx.device).train()
        self.d.to(ctx.device).train()
        self.opt_g = optimizer_from(self.make_opt_g, self.g.parameters())
        self.opt_d = optimizer_from(self.make_opt_d, self.d.parameters())
        # the generator makes 32x32 images: another data.image_size is refused by the source with the size to set
        images = ctx.data.image_batches(ctx.batch_size, ctx.batches, (3, 32, 32), 10, ctx.seed)
        # real images scaled to the generator's tanh range
        self.real = [torch.tanh(x).to(ctx.device) for x, _ in images]
        gen = torch.Generator().manual_seed(ctx.seed + 1)
        self.noise = [torch.randn(ctx.batch_size, self.nz, 1, 1, generator=gen).to(ctx.device)
                      for _ in range(ctx.batches)]
        self.ones = torch.ones(ctx.batch_size, 1, device=ctx.device)
        self.zeros = torch.zeros(ctx.batch_size, 1, device=ctx.device)
        self.i = 0

    def step(self) -> StepLoss:
        real, z = self.real[self.i % len(self.real)], self.noise[self.i % len(self.noise)]
        self.i += 1
        fake = self.g(z)
        # discriminator: real -> 1, fake -> 0 (the fake is detached: this update must not reach G)
        self.opt_d.zero_grad(set_to_none=True)
        loss_d = (F.binary_cross_entropy_with_logits(self.d(real), self.ones)
                  + F.binary_cross_entropy_with_logits(self.d(fake.detach()), self.zeros))
        loss_d.backward()
        self.opt_d.step()
        # generator: make D call the fake real (the non-saturating loss of the paper)
        self.opt_g.zero_grad(set_to_none=True)
        loss_g = F.binary_cross_entropy_with_logits(self.d(fake), self.ones)
        loss_g.backward()
        self.opt_g.step()
        # the discriminator's loss is the headline (it falls as D learns to tell the batches from the fakes);
        # the generator's rises as D wins: a GAN's two losses are a contest, not one figure falling
        return {"loss_d": loss_d.detach(), "loss_g": loss_g.detach()}

    def batch_recipe(self) -> Optional[BatchRecipe]:
        return BatchRecipe(IMAGES)  # its image set, augmented as the classifiers' is

    def take_batch(self, batch: Any) -> None:
        self.real = [torch.tanh(batch[0])]  # as in setup: scaled to the generator's tanh range; the noise cycles on

    def modules(self) -> List[torch.nn.Module]:
        return [self.g, self.d]

    def extra_metrics(self, measured_steps: int) -> Dict[str, Any]:
        return {"input_shape": [3, 32, 32]}  # the generator's output and the discriminator's input
