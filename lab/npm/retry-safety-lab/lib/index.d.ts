// Types for TypeScript tests (Vitest, ts-jest); the code is plain JavaScript.
export interface RouteCounts {
  route: string; kind: "write" | "read"; operations: number; attempts: number;
  upstream_requests: number; pending: number; applied_twice: number; uncertain: number;
  answered_ok: number; answered_ok_unconfirmed: number; failed_after_upstream: number;
  failed_sent_no_answer: number; failed_provably_unsent: number;
}
export interface Report {
  routes: RouteCounts[]; writes: number; reads: number; applied_twice: number;
  uncertain: number; refused_over_limit: number; pending: number; reads_recovered: number;
  reads_recovered_unconfirmed: number; writes_answered: number;
  writes_answered_unconfirmed: number; max_applied_twice: number; pass: boolean;
  failures: string[];
}
export interface LabOptions {
  upstream: string; faults?: string | string[]; listen?: string; writes?: string | string[];
  reads?: string | string[]; opHeader?: string; opId?: string; keyHeader?: string;
  replayedHeader?: string; slowMs?: number; maxBody?: number; maxAppliedTwice?: number;
  drainMs?: number; extraArgs?: string[]; startupTimeoutMs?: number;
}
export interface Lab { url: string; stop(): Promise<Report>; check(): Promise<Report> }
export function startLab(options: LabOptions): Promise<Lab>;
export function startUpstream(options?: { listen?: string; startupTimeoutMs?: number }):
  Promise<{ url: string; stop(): Promise<number> }>;
export function findBinary(): string;
export function failureMessage(report: Report): string;
export class LabError extends Error {}
export class LabFailed extends Error { report: Report }
