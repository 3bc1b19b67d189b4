"""The one job runner: config checks, run-directory locks and attempts, starting and
supervising worker groups, and the clusters they run on. Only this package starts
worker processes."""

from omegaconf import OmegaConf

from gtopk.records.claim import short_folder

# conf/config.yaml's run folders: ${gtopk.folder:<overrides>} keeps a name within 255 bytes
if not OmegaConf.has_resolver("gtopk.folder"):
    OmegaConf.register_new_resolver("gtopk.folder", short_folder)
