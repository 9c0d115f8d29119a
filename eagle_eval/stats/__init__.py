"""Statistics over counts, with no model and no torch: acceptance rates and the speedup model (`acceptance`), the
distribution check's statistic and verdict (`distribution`), ablation advice from repeated timings (`advice`),
ratio estimators over prompts with their intervals (`clustered`), acceptance by context length (`context`).

The ground floor beside `records`: every stage may import it. May import: errors, records. Never: anything else.
"""
