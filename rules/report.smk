# Tables (rebuilt from raw artifacts alone) and the report.


rule tables:
    input:
        unpack(tables_inputs),
    output:
        cells=layout.table("cells"),
        requests=layout.table("requests"),
        deployments=layout.table("deployments"),
        gates=layout.table("gates"),
    log:
        layout.log("report", "tables"),
    benchmark:
        layout.benchmark("report", "tables")
    params:
        # the cell summaries, deployment records and gates given as inputs (rules/common.smk: tables_args)
        files=tables_args,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy tables {params.files} --out $(dirname {output.cells}) > {log} 2>&1"


rule build_report:
    input:
        unpack(report_inputs),
        # the pinned model-launch example (recommendation.model_launch): its manifest and verbatim copy
        model_launch=model_launch_files(),
    output:
        markdown=report(layout.report_file("report.md"), caption="../report/report.rst", category="Report"),
        html=layout.report_file("report.html"),
        recommendation=report(layout.report_file("recommendation.json"), caption="../report/recommendation.rst",
                              category="Report"),
        plots=report(directory(layout.report_file("plots")), patterns=["{name}.png"], caption="../report/plot.rst",
                     category="Plots", labels={"figure": "{name}"}),
        # empty patch, and the Markdown says why, when nothing is proposed (docs/report.md)
        model_launch_patch=layout.report_file("model-launch.patch"),
        model_launch_pr=layout.report_file("model-launch-pr.md"),
    log:
        layout.log("report", "report"),
    benchmark:
        layout.benchmark("report", "report")
    params:
        config=CONFIG_FILE,
        # every file the report reads, given as inputs (rules/common.smk: report_args; planned stale: --results)
        files=report_args,
    conda:
        "../envs/specstudy.yaml"
    shell:
        "specstudy report {params.files} --config {params.config} --out $(dirname {output.markdown}) > {log} 2>&1"
