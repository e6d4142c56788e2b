"""The distributed discrete Gaussian mechanism (D88): pure building blocks.

A leaf package: numpy, scipy (the divergence check only), the standard
library and dp_accounting (`accounting` only); nothing of fedmask's.

- `mechanism`     the steps end to end: `MechanismConfig`, `encode` (a
                  device), `decode_sum` (the server), `privacy_rho`
- `rotation`      randomised Hadamard rotation from a shared seed
- `quantize`      L2 clip, randomised rounding under the conditional norm bound
- `exact_sampler` N_Z(0, sigma^2) with integer arithmetic from a CSPRNG
- `fast_sampler`  the same law from a seeded numpy Generator (simulator)
- `random_source` exact uniform integers from os.urandom (or a Generator,
                  or SHAKE-256 from a seed)
- `field`         centred arithmetic mod 2^w and the bound on a sum wrapping
- `accounting`    the sum's Renyi DP / zCDP bound, epsilon via dp_accounting
- `removable_noise` Dordis's shares for the worst tolerated dropout, the
                  surplus regenerated from seeds, the bound for shares of
                  different variances (pure; not wired into the protocol)
- `divergence`    exact laws and Renyi divergences over the integers (checks)
- `speed`         `python -m dpmech.speed`: the exact sampler's time per draw
- `plan`          the planner: the noise a target epsilon needs, and what it
                  costs the model (`fedmask privacy plan`)
- `claims`        epsilon as the product states it: its delta, the unit it
                  protects, and the same noise at a production-size population
- `audit`         the empirical epsilon of canaries' cosines (Andrew et al.'s
                  Gaussian fit, a bootstrap interval): `fedmask audit` (D92)

Importing the package imports none of its modules (dp_accounting is slow
to import).
"""

#: The unit every epsilon protects: neighbouring inputs differ in one
#: device's update (`accounting`'s adjacency). Here so that a service can
#: name it without importing dp_accounting.
PROTECTS = "one device, all of its data"

