"""Pure decisions: functions of what is observed and the clock value passed in; no I/O.

Callers: `tandem.operator.runtime.reconcile` (`plan.decide` on each pass, the status it writes, the refused
creates' backoff) and `tandem.operator.runtime.leader` (`lease_policy`).
  observe           a pod's manifest -> the PodState summary every policy reads
  plan, plan_pass   the reconcile decision: an ordered table of rules over an Observation, building a Plan
  restart_policy    gang restarts: which failures count, restart or fail, backoff
  pool_policy       a lost rollout-only pod replaced alone, its bound; pods kept through a gang restart
  stuck_policy      stuck gangs: waiting containers, crash loops, unschedulable pods -> verdicts
  admission_policy  Kueue: waiting for admission, preemption
  scale_policy      the rollout-only pool's /scale: pods known, excess, running
  refusal_policy    pod creates the API server refuses, and when to ask again
  job_status        the job's status: phase, conditions, progress fields, transition events
  eta               the status progress block: percent, rate, time left
  lease_policy      leader election's decision over the Lease
"""
