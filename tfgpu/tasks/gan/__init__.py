"""The GAN task and what only it uses: FID/KID, DiffAugment, sample grids, its report section."""
