{{/* Names and labels shared by the templates. */}}
{{- define "tandem.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tandem.labels" -}}
app.kubernetes.io/name: tandem
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tandem.operatorSelector" -}}
app.kubernetes.io/name: tandem
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "tandem.serviceAccountName" -}}
{{- default (printf "%s-operator" (include "tandem.fullname" .)) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "tandem.etcdEndpoints" -}}
{{- if .Values.operator.etcdEndpoints -}}
{{- join "," .Values.operator.etcdEndpoints -}}
{{- else if .Values.etcd.enabled -}}
{{- printf "%s://tandem-etcd.%s.svc:2379" (ternary "https" "http" .Values.etcd.tls.enabled) .Release.Namespace -}}
{{- else -}}
{{- fail "set operator.etcdEndpoints or etcd.enabled=true" -}}
{{- end -}}
{{- end -}}

{{/* What the operator does to RLHFJobs and the objects it owns, in a watched namespace. */}}
{{- define "tandem.jobRules" -}}
- apiGroups: [tandem.dev]
  resources: [rlhfjobs]
  verbs: [get, list, watch, patch]
- apiGroups: [tandem.dev]
  resources: [rlhfjobs/status]
  verbs: [get, patch]
# patch: labels only (a rollout-only pod kept through a gang restart joins the new generation)
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
# the job's Service, token Secret and job-document ConfigMap: created, never read or changed (the document
# is immutable and named by its content; a changed spec gets a new one)
- apiGroups: [""]
  resources: [services, secrets, configmaps]
  verbs: [create]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# spec.gangScheduling (Kubernetes >= 1.36): the job's Workload and one PodGroup per gang; the garbage
# collector deletes both with the job, the operator deletes an earlier gang's PodGroup
- apiGroups: [scheduling.k8s.io]
  resources: [workloads]
  verbs: [get, create]
- apiGroups: [scheduling.k8s.io]
  resources: [podgroups]
  verbs: [get, list, create, delete]
# spec.gpuAllocation dra: the job's ResourceClaimTemplate (its pods' claims are the scheduler's and the
# kubelet's); the garbage collector deletes it with the job
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, create]
# the hybrid pods' PodDisruptionBudget (spec.podDisruptionBudget; owned by the job): created, and deleted when
# a job opts out
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, delete]
{{- if and .Values.networkPolicy.enabled (eq .Values.networkPolicy.scope "job") }}
# networkPolicy.scope job: each job's NetworkPolicy (owned by the job, deleted with it)
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create]
{{- end }}
{{- end -}}
