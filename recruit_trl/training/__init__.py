"""The RL trainer: :class:`~recruit_trl.training.trainer.RecruitGRPOTrainer` (TRL's ``GRPOTrainer`` with packed groups,
legal-token log-probabilities, length-sorted micro-batches, episode advantages and the control), its REINFORCE
subclass, and the check of the private TRL members they rely on."""
